"""Launchers: validate inputs, allocate outputs, compute grids and launch the kernels."""
