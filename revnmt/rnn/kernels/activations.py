"""The activations every fused kernel computes its gates with, as plain numbers.

tanh(x) ≈ x·P(x²)/Q(x²) on [−c, c] (Eigen's float32 rational fit; tanh(±c) rounds to ±1 within a few
ulp), and σ(x) = ½ + ½·tanh(x/2). It is multiplies, adds and one division, each correctly rounded in
float32, so a CPU loop (numba) and a GPU kernel (Triton) that evaluate it in this order get the same bits,
and LLVM vectorizes it where a libm ``tanhf`` call per element cost more than the rest of a step. Its
error, a few ulp of float32, is below the fixed point's 2^-23. The kernels of each backend turn these
numbers into their own constants (``np.float32``, ``tl.constexpr``): this module imports neither, so no
backend's kernels import another's.
"""

#: Inputs beyond ±TANH_CLAMP give tanh = ±1 (to float32 rounding).
TANH_CLAMP = 7.90531110763549805
#: P's coefficients, of x^0 … x^12 (odd powers of x in tanh = x·P(x²)/Q(x²)).
TANH_NUMERATOR = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05, 5.12229709037114e-08,
                  -8.60467152213735e-11, 2.00018790482477e-13, -2.76076847742355e-16)
#: Q's coefficients, of x^0 … x^6.
TANH_DENOMINATOR = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04, 1.19825839466702e-06)
