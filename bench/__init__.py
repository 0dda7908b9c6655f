"""fastad's benchmark suite: fastad against hand-written NumPy, PyTorch, JAX and HIPS autograd. Run `python -m bench`."""
