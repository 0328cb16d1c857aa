"""Submissions: package a user's module as the target expects it (`package`), re-check an
archive without importing it (`archive.inspect_archive`), and the interface it must match."""
