"""The parts of bench/bench_scale.py: kernels, reference sampler, service, plot."""
