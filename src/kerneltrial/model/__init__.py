"""Whole-model trials: a causal LM whose operator implementations differ by arm (issue 15)."""
