"""Benchmarks of nuvec_tg's hot paths against tinygrad's own composition and PyTorch (`python -m nuvec_tg.bench`)."""
