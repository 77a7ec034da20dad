//! Two questions about the q8 products' arithmetic on an AVX-512 VNNI core,
//! one thread, data in L1:
//!
//! 1. How many 512-bit `vpdpbusd` (and, beside them, 512-bit float32 FMAs)
//!    the core retires per second, 12 independent chains; and the clock,
//!    from a chain of dependent `imul` (3 cycles each). Their ratio is the
//!    instructions per cycle: about 1 means one port, about 2 two.
//! 2. What the q8 tile's work per 16-row block and x row costs with nothing
//!    else in the way (`rust/kernels.rs`, `q8_tile_512` for Q4_1 at 5 x
//!    rows): the 8 `vpdpbusd` in two chains, their sum, then the float
//!    epilogue (the scale product, the conversion, two FMAs into the
//!    accumulator); and the same without the epilogue. Accumulators in
//!    registers, the operands of 64 blocks L1-resident.
//! 3. What the x broadcasts cost: the same work with x's 8 groups held in
//!    registers (the operations less the 8 broadcast loads), and with the
//!    rows' chains advanced side by side (program order that needs no
//!    look-ahead across a row's chain).
//!
//!     cargo run --release --manifest-path benchmarks/vnni_probe/Cargo.toml
//!
//! x86_64 with AVX-512 F/BW and VNNI (else it says so and exits). Best of 5.

use std::arch::x86_64::*;
use std::hint::black_box;
use std::time::Instant;

fn best<F: FnMut()>(mut f: F) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Cycles per second, from dependent `imul`s (latency 3).
fn clock() -> f64 {
    let n = 200_000_000u64;
    let seconds = best(|| {
        let mut x = black_box(3u64);
        for _ in 0..n {
            // SAFETY: register arithmetic only.
            unsafe {
                std::arch::asm!("imul {0}, {0}", "imul {0}, {0}", "imul {0}, {0}", "imul {0}, {0}", inout(reg) x)
            };
        }
        black_box(x);
    });
    12.0 * n as f64 / seconds
}

/// Twelve independent chains of `op`, `n` rounds; operations per second.
macro_rules! rate {
    ($n:expr, $zero:expr, $op:expr) => {{
        let n: u64 = $n;
        let seconds = best(|| {
            let [mut a0, mut a1, mut a2, mut a3, mut a4, mut a5] = [$zero; 6];
            let [mut a6, mut a7, mut a8, mut a9, mut a10, mut a11] = [$zero; 6];
            for _ in 0..n {
                a0 = $op(a0);
                a1 = $op(a1);
                a2 = $op(a2);
                a3 = $op(a3);
                a4 = $op(a4);
                a5 = $op(a5);
                a6 = $op(a6);
                a7 = $op(a7);
                a8 = $op(a8);
                a9 = $op(a9);
                a10 = $op(a10);
                a11 = $op(a11);
            }
            black_box([a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11]);
        });
        12.0 * n as f64 / seconds
    }};
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dpbusd_rate(n: u64) -> f64 {
    let b = black_box(_mm512_set1_epi8(3));
    rate!(n, _mm512_set1_epi32(1), |a| _mm512_dpbusd_epi32(a, b, b))
}

#[target_feature(enable = "avx512f,fma")]
unsafe fn fma_rate(n: u64) -> f64 {
    let (u, v) = (black_box(_mm512_set1_ps(1.0001)), black_box(_mm512_set1_ps(0.9999)));
    rate!(n, _mm512_set1_ps(1.0), |a| _mm512_fmadd_ps(a, u, v))
}

const BLOCKS: usize = 64;
const XR: usize = 5;

struct Panel {
    ops: Vec<[__m512i; 8]>,
    d: Vec<__m512>,
    m: Vec<__m512>,
    x: Vec<[[i32; 8]; XR]>,
    xd: Vec<[f32; XR]>,
    xs: Vec<[f32; XR]>,
}

/// The tile's variants: the work as `q8_tile_512` does it, without the float
/// epilogue, with x's groups held in registers instead of broadcast from memory
/// (wrong sums, the same operations less the 8 broadcast loads; row r pairs
/// operand i with register (i + r) mod 8, so no two rows' sums coincide), and
/// with the rows' chains advanced side by side operand by operand.
const FULL: u8 = 0;
const NO_EPILOGUE: u8 = 1;
const X_IN_REGISTERS: u8 = 2;
const ROWS_INTERLEAVED: u8 = 3;

/// Seconds per (block, x row) of the tile's work over `reps` passes of 64 blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn tile_cost<const VARIANT: u8>(p: &Panel, reps: usize) -> f64 {
    let held: [__m512i; 8] = black_box(core::array::from_fn(|i| _mm512_set1_epi32(p.x[0][0][i])));
    let seconds = best(|| {
        let mut acc = [_mm512_setzero_ps(); XR];
        let mut iacc = [_mm512_setzero_si512(); XR];
        for _ in 0..reps {
            for b in 0..BLOCKS {
                let ops = black_box(&p.ops[b]);
                let mut sums = [[_mm512_setzero_si512(); 2]; XR];
                if VARIANT == ROWS_INTERLEAVED {
                    for i in 0..8 {
                        for (r, s) in sums.iter_mut().enumerate() {
                            s[i % 2] = _mm512_dpbusd_epi32(s[i % 2], ops[i], _mm512_set1_epi32(p.x[b][r][i]));
                        }
                    }
                }
                for r in 0..XR {
                    let [mut s0, mut s1] = sums[r];
                    if VARIANT != ROWS_INTERLEAVED {
                        for i in (0..8).step_by(2) {
                            let (x0, x1) = if VARIANT == X_IN_REGISTERS {
                                (held[(i + r) % 8], held[(i + 1 + 2 * r) % 8])
                            } else {
                                (_mm512_set1_epi32(p.x[b][r][i]), _mm512_set1_epi32(p.x[b][r][i + 1]))
                            };
                            s0 = _mm512_dpbusd_epi32(s0, ops[i], x0);
                            s1 = _mm512_dpbusd_epi32(s1, ops[i + 1], x1);
                        }
                    }
                    let s = _mm512_add_epi32(s0, s1);
                    if VARIANT == NO_EPILOGUE {
                        iacc[r] = _mm512_add_epi32(iacc[r], s);
                    } else {
                        let scale = _mm512_mul_ps(p.d[b], _mm512_set1_ps(p.xd[b][r]));
                        acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc[r]);
                        acc[r] = _mm512_fmadd_ps(p.m[b], _mm512_set1_ps(p.xs[b][r]), acc[r]);
                    }
                }
            }
        }
        black_box((acc, iacc));
    });
    seconds / (reps * BLOCKS * XR) as f64
}

fn main() {
    if !(is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni"))
    {
        println!("this CPU has no AVX-512 VNNI");
        return;
    }
    let hz = clock();
    // SAFETY: the features were detected above.
    let (dp, fma) = unsafe { (dpbusd_rate(50_000_000), fma_rate(50_000_000)) };
    println!("clock ~{:.2} GHz (dependent imul)", hz / 1e9);
    println!("vpdpbusd zmm: {:.2} G/s = {:.2} a cycle", dp / 1e9, dp / hz);
    println!("fma zmm:      {:.2} G/s = {:.2} a cycle", fma / 1e9, fma / hz);
    let mut seed = 1u32;
    let mut next = || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        seed
    };
    // SAFETY: the features were detected above.
    let p = unsafe {
        Panel {
            ops: (0..BLOCKS)
                .map(|_| [0; 8].map(|_: i32| _mm512_set1_epi32((next() & 0x0f0f_0f0f) as i32)))
                .collect(),
            d: (0..BLOCKS).map(|_| _mm512_set1_ps(1e-3)).collect(),
            m: (0..BLOCKS).map(|_| _mm512_set1_ps(1e-4)).collect(),
            x: (0..BLOCKS)
                .map(|_| [[0; 8]; XR].map(|row| row.map(|_: i32| next() as i32)))
                .collect(),
            xd: vec![[1e-2; XR]; BLOCKS],
            xs: vec![[1.0; XR]; BLOCKS],
        }
    };
    // SAFETY (each call): the features were detected above.
    let (full, bare) = unsafe { (tile_cost::<FULL>(&p, 20_000), tile_cost::<NO_EPILOGUE>(&p, 20_000)) };
    println!(
        "q8 tile, per 16-row block and x row ({XR} rows): {:.2} ns = {:.1} cycles with the float epilogue, \
         {:.2} ns = {:.1} cycles without (8 vpdpbusd: {:.1} cycles at 2 a cycle)",
        full * 1e9,
        full * hz,
        bare * 1e9,
        bare * hz,
        4.0
    );
    let (held, interleaved) = unsafe {
        (
            tile_cost::<X_IN_REGISTERS>(&p, 20_000),
            tile_cost::<ROWS_INTERLEAVED>(&p, 20_000),
        )
    };
    println!(
        "the same with x's groups in registers (no broadcast loads): {:.1} cycles; \
         with the rows' chains interleaved operand by operand: {:.1} cycles",
        held * hz,
        interleaved * hz
    );
}
