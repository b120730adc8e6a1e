"""Deliberately faulty backends: the suite must fail each of them. ``bad_backends`` crashes,
hangs, raises and returns garbage; ``streamed`` is a correct streamed kernel with one planted
mistake a factory; ``approx_tanh`` emulates an approximate soft-cap, declared or not."""
