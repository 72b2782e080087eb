"""The Gluon kernels for Hopper (SM90): warp-specialized attention on wgmma. Kernels:
``wgmma.py``, ``pingpong.py``, ``pingpong8.py``, ``fewrows.py``, ``fp8qk.py``; their building
blocks: ``common.py`` (shared by several), ``request.py``, ``producers.py``, ``fp8_stage.py``,
``fp8_values.py``, ``fp8qk_score.py``."""
