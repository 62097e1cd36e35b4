// Prompt products for CPU adapters (llvmpipe/lavapipe): Y[m][n] = Σ_k X[m][k] · W[n][k], as
// matmul.wgsl, laid out for how such a driver runs a kernel. It runs a subgroup of 8
// invocations as the lanes of one SIMD register, and a load whose address differs between
// lanes goes one lane and one component at a time through the stack: loads, not arithmetic,
// set the speed (they are ~80 % of the GPU tiles' time on lavapipe, `perf`). So a workgroup is
// one subgroup computing a 32×32 tile with no workgroup memory (the CPU's caches stage it).
// Per 4-deep step of k, each lane loads a vec4 of X for 4 of the tile's rows, which
// subgroupBroadcast hands to every lane, and a vec4 of W for each of its 4 columns: 512
// multiply-adds per 8 loads, where the 128-wide GPU tile does 64 per 4. No k split.
//
// Defines: as matmul.wgsl (no SPLIT_K; QUANT: block-quantized W decoded by quant.wgsl's q_pair),
// and KSTEPS: 4-deep k steps per W load (1 for f32, 2 for f16 and blocks). The bindings and the
// epilogue are in matmul_io.wgsl.

// Rows and columns of a workgroup's tile; the subgroup's lanes own columns n0 + lane + 8c.
const SR: u32 = 32u;
const SC: u32 = 32u;

// Where k index `col` reads a convolution's input: channel, tap column, tap row. Carried from
// step to step rather than divided out of `col`: a CPU adapter divides lane by lane.
struct Tap {
    c: u32,
    kx: u32,
    ky: u32,
}

fn tap_after(t: Tap, by: u32) -> Tap {
    var r = t;
#if CONV
    r.c += by;
    while (r.c >= cv.cin) {
        r.c -= cv.cin;
        r.kx += 1u;
        if (r.kx == cv.ksize) {
            r.kx = 0u;
            r.ky += 1u;
        }
    }
#endif
    return r;
}

// X[row][col] (zero past k, or outside a convolution's input; `at` is the row's corner and
// `t` the tap of `col`).
fn x_at(row: u32, at: vec2<i32>, col: u32, t: Tap) -> f32 {
    if (col >= p.k) {
        return 0.0;
    }
#if CONV
    let iy = at.x + i32(t.ky);
    let ix = at.y + i32(t.kx);
    if (iy < 0 || ix < 0 || iy >= i32(cv.in_h << cv.up) || ix >= i32(cv.in_w << cv.up)) {
        return 0.0;
    }
    return x[((u32(iy) >> cv.up) * cv.in_w + (u32(ix) >> cv.up)) * cv.cin + t.c];
#else
    return x[row * p.k + col];
#endif
}

fn x4(row: u32, at: vec2<i32>, col: u32, t: Tap) -> vec4<f32> {
    let t1 = tap_after(t, 1u);
    let t2 = tap_after(t1, 1u);
    let t3 = tap_after(t2, 1u);
    return vec4<f32>(x_at(row, at, col, t), x_at(row, at, col + 1u, t1),
        x_at(row, at, col + 2u, t2), x_at(row, at, col + 3u, t3));
}

// acc += x[0]·k0 + … + x[3]·k3: one row's four k against this lane's four columns.
fn madd(acc: vec4<f32>, x: vec4<f32>, k0: vec4<f32>, k1: vec4<f32>, k2: vec4<f32>,
    k3: vec4<f32>) -> vec4<f32> {
    return acc + x.x * k0 + x.y * k1 + x.z * k2 + x.w * k3;
}

#if QUANT
fn pair_half(pair: QPair, h: u32) -> vec4<f32> {
    if (h == 0u) {
        return pair.a;
    }
    return pair.b;
}
#endif

// Writes a row's outputs at this lane's columns through the epilogue.
fn store_row(row: u32, col0: u32, v: vec4<f32>) {
    if (row >= step.n_tokens) {
        return;
    }
    for (var c = 0u; c < 4u; c++) {
        let col = col0 + 8u * c;
        if (col < p.n) {
            y[row * p.n + col] = epilogue(v[c], row, col);
        }
    }
}

@compute @workgroup_size(8)
fn main(@builtin(subgroup_invocation_id) lane: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let m0 = wid.y * SR;
    let n0 = wid.x * SC;
    // Rows and columns past the product are clamped to its last ones; their outputs are
    // never stored.
#for i in 0..4
    let row{{i}} = min(m0 + {{i}}u * 8u + lane, step.n_tokens - 1u);
    let at{{i}} = corner(row{{i}});
#endfor
#for c in 0..4
    let wcol{{c}} = min(n0 + {{c}}u * 8u + lane, p.n - 1u);
#endfor
    // acc<i>_<l>: row m0 + 8i + l at this lane's four columns.
#for i in 0..4
#for l in 0..8
    var acc{{i}}_{{l}} = vec4<f32>(0.0);
#endfor
#endfor
    var tap = Tap(0u, 0u, 0u);
    for (var k0 = 0u; k0 < p.k; k0 += 4u * {{KSTEPS}}u) {
#if QUANT
        // Eight k of a 32-weight sub-block (block formats have whole sub-blocks in k).
#for c in 0..4
        let pair{{c}} = q_pair(wcol{{c}}, k0 / 32u, p.q_scales, (k0 % 32u) / 4u);
#endfor
#else
#for c in 0..4
        let word{{c}} = w[wcol{{c}} * p.row_vecs + k0 / (4u * {{KSTEPS}}u)];
#endfor
#endif
#for h in 0..KSTEPS
        {
            let kh = k0 + 4u * {{h}}u;
#for i in 0..4
            let x{{i}} = x4(row{{i}}, at{{i}}, kh, tap);
#endfor
            tap = tap_after(tap, 4u);
#if QUANT
#for c in 0..4
            let w{{c}} = pair_half(pair{{c}}, {{h}}u);
#endfor
#else
#if F16
#for c in 0..4
            let w{{c}} = vec4<f32>(unpack2x16float(word{{c}}[2u * {{h}}u]),
                unpack2x16float(word{{c}}[2u * {{h}}u + 1u]));
#endfor
#else
#for c in 0..4
            let w{{c}} = word{{c}};
#endfor
#endif
#endif
            // The step's four k, each across this lane's four columns.
            let k0v = vec4<f32>(w0.x, w1.x, w2.x, w3.x);
            let k1v = vec4<f32>(w0.y, w1.y, w2.y, w3.y);
            let k2v = vec4<f32>(w0.z, w1.z, w2.z, w3.z);
            let k3v = vec4<f32>(w0.w, w1.w, w2.w, w3.w);
#for i in 0..4
#for l in 0..8
            acc{{i}}_{{l}} = madd(acc{{i}}_{{l}}, subgroupBroadcast(x{{i}}, {{l}}u), k0v, k1v, k2v, k3v);
#endfor
#endfor
        }
#endfor
    }
#for i in 0..4
#for l in 0..8
    store_row(m0 + {{i}}u * 8u + {{l}}u, n0 + lane, acc{{i}}_{{l}});
#endfor
#endfor
}
