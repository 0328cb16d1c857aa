"""Replicate directories (`kerneltrial replicate`): the cross-run table, its verify check and replicates.md."""
