"""Where the residual stream's gradient is written out once: XLA:CPU on JAX.

The gradient of the residual stream at block l sums every later block's
LayerNorm backward. XLA:CPU (in JAX's jaxlib) fuses that elementwise chain into
each of its consumers instead of computing it once, so the fusions grow with
the square of the depth, which slows both the training step and its compile
(docs/performance.md).
XLA does not fuse across a conditional, and removes `optimization_barrier`s
before fusion on the CPU, so the gradient crossing a block's output passes
through a `lax.cond` whose predicate is true for every bit pattern but is not a
constant XLA can fold.
The forward pass, other backends and other JAX platforms are untouched (a
conditional on a GPU waits for the device to read its predicate).
"""

import functools

import keras


def gradient_boundary(x):
    """`x`; on JAX's CPU backend, its gradient is materialized here."""
    if keras.backend.backend() != "jax":
        return x
    import jax

    if jax.default_backend() != "cpu":
        return x
    return _materialized_gradient()(x)


@functools.cache
def _materialized_gradient():
    import jax
    from jax import numpy as jnp

    @jax.custom_vjp
    def identity(x):
        return x

    def backward(_, gradient):
        first = jnp.ravel(gradient)[0]
        bits = jax.lax.bitcast_convert_type(first, jnp.dtype(f"int{8 * first.dtype.itemsize}"))
        always = (bits | 1) != 0  # an odd integer is never 0
        return (jax.lax.cond(always, lambda g: g, lambda g: jnp.full_like(g, jnp.nan), gradient),)

    identity.defvjp(lambda x: (x, None), backward)
    return identity
