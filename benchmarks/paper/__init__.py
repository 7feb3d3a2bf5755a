"""The paper's experiments (``ferret bench``) and its numbers, extracted from its LaTeX."""
