//! What one 32-element block costs on Intel AMX's integer tiles, the way a
//! q8 product over m x rows would use them: load the block's x rows (A, m ×
//! 32 bytes) and its 16 weight rows (B, 8 × 64 bytes), zero the sums, one
//! `tdpbsud`, store the m × 16 sums (C) for their per-block float scaling.
//! Printed per block (ns), on one thread, data in cache: the sequence as is,
//! with four C registers in turn, the products alone, and `ldtilecfg`.
//!
//!     cargo run --release --manifest-path benchmarks/amx_probe/Cargo.toml
//!
//! Linux only, on a CPU with AMX-TILE and AMX-INT8 (else it says so and exits).

use std::arch::asm;
use std::time::Instant;

#[repr(C, align(64))]
struct Config([u8; 64]);
#[repr(C, align(64))]
struct Weights([u8; 512 * 64]);
#[repr(C, align(64))]
struct SumsBuf([i32; 16 * 16 * 64]);

fn granted() -> bool {
    // SAFETY: cpuid exists on every x86_64 CPU.
    #[allow(unused_unsafe)]
    let edx = unsafe { std::arch::x86_64::__cpuid_count(7, 0) }.edx;
    if (edx >> 24) & 1 == 0 || (edx >> 25) & 1 == 0 {
        return false;
    }
    let ret: i64;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
    unsafe {
        asm!("syscall", inlateout("rax") 158i64 => ret, in("rdi") 0x1023i64, in("rsi") 18i64,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

fn main() {
    if !granted() {
        println!("this CPU or OS offers no AMX integer tiles");
        return;
    }
    for &m in &[1usize, 5, 9, 16] {
        let a = vec![1i8; 16 * 1024];
        let b = Box::new(Weights([1; 512 * 64]));
        let mut c = Box::new(SumsBuf([0; 16 * 16 * 64]));
        let mut cfg = Config([0; 64]);
        cfg.0[0] = 1;
        let mut set = |t: usize, rows: usize, bytes: u16| {
            cfg.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&bytes.to_le_bytes());
            cfg.0[48 + t] = rows as u8;
        };
        for t in 0..2 {
            set(t, m, 32);
            set(2 + t, 8, 64);
        }
        for t in 4..8 {
            set(t, m, 64);
        }
        let iters = 400_000usize;
        // SAFETY: every tile instruction below reads and writes only the buffers above.
        unsafe {
            asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr());
            let t0 = Instant::now();
            for i in 0..iters {
                let j = i % 64;
                asm!("tileloadd tmm0, [{a} + {k}*1]", "tileloadd tmm2, [{b} + {s}*1]", "tilezero tmm4",
                     "tdpbsud tmm4, tmm0, tmm2", "tilestored [{c} + {s}*1], tmm4",
                     a = in(reg) a.as_ptr().add(32 * (j % 16)), k = in(reg) 1024usize,
                     b = in(reg) b.0.as_ptr().add(512 * j), c = in(reg) c.0.as_mut_ptr().add(256 * (j % 16)),
                     s = in(reg) 64usize);
            }
            let serial = t0.elapsed().as_nanos() as f64 / iters as f64;
            let t0 = Instant::now();
            for i in 0..iters / 4 {
                let j = (4 * i) % 64;
                asm!("tileloadd tmm0, [{a} + {k}*1]", "tileloadd tmm2, [{b} + {s}*1]", "tilezero tmm4", "tdpbsud tmm4, tmm0, tmm2",
                     "tileloadd tmm1, [{a} + {k}*1]", "tileloadd tmm3, [{b} + {s}*1 + 512]", "tilezero tmm5", "tdpbsud tmm5, tmm1, tmm3",
                     "tileloadd tmm0, [{a} + {k}*1]", "tileloadd tmm2, [{b} + {s}*1 + 1024]", "tilezero tmm6", "tdpbsud tmm6, tmm0, tmm2",
                     "tileloadd tmm1, [{a} + {k}*1]", "tileloadd tmm3, [{b} + {s}*1 + 1536]", "tilezero tmm7", "tdpbsud tmm7, tmm1, tmm3",
                     "tilestored [{c} + {s}*1], tmm4", "tilestored [{c} + {s}*1 + 1024], tmm5",
                     "tilestored [{c} + {s}*1 + 2048], tmm6", "tilestored [{c} + {s}*1 + 3072], tmm7",
                     a = in(reg) a.as_ptr(), k = in(reg) 1024usize, b = in(reg) b.0.as_ptr().add(512 * j),
                     c = in(reg) c.0.as_mut_ptr(), s = in(reg) 64usize);
            }
            let turns = t0.elapsed().as_nanos() as f64 / iters as f64;
            let t0 = Instant::now();
            for _ in 0..iters / 4 {
                asm!(
                    "tdpbsud tmm4, tmm0, tmm2",
                    "tdpbsud tmm5, tmm1, tmm3",
                    "tdpbsud tmm6, tmm0, tmm2",
                    "tdpbsud tmm7, tmm1, tmm3"
                );
            }
            let products = t0.elapsed().as_nanos() as f64 / iters as f64;
            let t0 = Instant::now();
            for _ in 0..20_000 {
                asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr());
            }
            let config = t0.elapsed().as_nanos() as f64 / 20_000.0;
            asm!("tilerelease");
            println!(
                "m = {m:2}: per block {serial:5.1} ns as is, {turns:5.1} ns with four C registers in turn, \
                 {products:4.1} ns the products alone; ldtilecfg {config:.0} ns"
            );
        }
    }
}
