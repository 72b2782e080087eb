"""Engine integration tests (SGLang, vLLM); a package so its conftest does not shadow tests/conftest.py."""
