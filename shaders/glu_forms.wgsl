// How the two outputs of a fused gate/up product's row combine, `first` from its first block of
// weight rows and `second` from its second: prepended to glu.wgsl and to the prompt products
// (which gate in their epilogue, see matmul_io.wgsl's GLU).
//
// Defines: GLU (the kernel gates: without it the file is empty), GEGLU (diffusers'
// feed-forward: the value block first, exact GELU of the gate), GATE_TANH (Gemma: gelu_tanh
// of the gate block, first); otherwise SwiGLU, silu(gate) · up.

#if GLU
fn gated(first: f32, second: f32) -> f32 {
#if GEGLU
    return gelu_erf(second) * first;
#else
#if GATE_TANH
    return gelu_tanh(first) * second;
#else
    return first / (1.0 + exp(-first)) * second;
#endif
#endif
}
#endif
