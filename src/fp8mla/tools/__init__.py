"""Developer tools that need no GPU (the compile matrix)."""
