//! Int8 handoffs the expert products take (shaders/matvec_handoff.wgsl): rows in two levels
//! (MXFP4 experts read their inputs so), and a router's product handing off the normalised
//! input it stages to the gate/up product after it.

use super::{Storage, matrix};
use crate::common::{Rng, gpu};
use backpack_engine::gpu::{Gpu, Recorder, StorageBuffer};
use backpack_engine::load::GgmlType;
use backpack_engine::ops::{
    Int8Handoff, MatVec, MatVecLayout, MatVecOptions, Matrix, NormKind, StepParams, WeightDType,
};

/// Each input's int8 step: its 32-value block's largest value / 127, over `divisor` (1 for one
/// level, 127 for the second level's steps).
fn block_steps(x: &[f32], divisor: f32) -> Vec<f32> {
    x.chunks(32)
        .flat_map(|b| {
            let d = b.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            std::iter::repeat_n(d / divisor, b.len())
        })
        .collect()
}

/// Per output of `w` (`[n][len]`), the sum of |w| times its input's step: every input a step
/// apart.
fn step_bound(w: &[f32], x: &[f32], divisor: f32) -> Vec<f32> {
    let steps = block_steps(x, divisor);
    w.chunks(x.len())
        .map(|row| row.iter().zip(&steps).map(|(w, s)| w.abs() * s).sum())
        .collect()
}

/// Per output of `w`, two flips of its largest term (|w| times its input's step).
fn flip_bound(w: &[f32], x: &[f32], divisor: f32) -> Vec<f32> {
    let steps = block_steps(x, divisor);
    w.chunks(x.len())
        .map(|row| {
            2.0 * row
                .iter()
                .zip(&steps)
                .fold(0.0f32, |m, (w, s)| m.max(w.abs() * s))
        })
        .collect()
}

fn read(gpu: &Gpu, b: &StorageBuffer, n: usize) -> Vec<f32> {
    gpu.read(&b.buffer, 0, n as u64).expect("read")
}

/// The reader's outputs through the handoff against the same reader staging the row itself,
/// within `bound` (plus a relative 1e-4).
fn assert_within(what: &str, got: &[f32], want: &[f32], bound: &[f32]) {
    for (i, ((g, w), b)) in got.iter().zip(want).zip(bound).enumerate() {
        let allowed = b + 1e-4 * (w.abs() + 1.0);
        assert!(
            (g - w).abs() <= allowed,
            "{what}: output {i} is {g}, staged {w} (allowed {allowed})"
        );
    }
}

/// Readers of a row handed off in two levels (MXFP4 and Q8_0 rows with two-level inputs)
/// against the same readers quantizing the f32 row themselves, from writers whose workgroups
/// take 16 rows (each half of a block scaled alone, rounded again by the reader from both
/// levels) and 32 (whole blocks): the second level must carry the remainders, a step of it
/// 1/127 of the first's.
#[test]
fn rows_handed_off_in_two_levels_match_staging_them() {
    let gpu = gpu();
    let mut rng = Rng::new(77);
    let writer_layouts = [
        MatVecLayout {
            lanes: Some(32),
            rows: Some(2),
            workgroup: Some(256),
            blocks: Some(1),
            ..Default::default()
        },
        MatVecLayout {
            lanes: Some(16),
            rows: Some(1),
            workgroup: Some(128),
            blocks: Some(4),
            ..Default::default()
        },
    ];
    let fine = MatVecLayout {
        int8_fine: Some(true),
        ..Default::default()
    };
    let (len, k_in, n_out) = (160u32, 96u32, 23u32);
    let mut handed_off = 0;
    for reader_ty in [GgmlType::Mxfp4, GgmlType::Q8_0] {
        let (reader_w, reader_host) =
            matrix(&gpu, &mut rng, Storage::Blocks(reader_ty), n_out, len, &[]);
        for &layout in &writer_layouts {
            let handoff = Int8Handoff::with_rows(&gpu, len, 1, 2).expect("handoff");
            let writer_w = Matrix::from_f32(
                &gpu,
                "writer",
                &rng.vec((len * k_in) as usize, 1.0),
                len,
                k_in,
                WeightDType::F16,
            )
            .expect("writer");
            let x = gpu
                .storage_from("x", &rng.vec(k_in as usize, 2.0))
                .expect("x");
            let row = gpu.storage("row", u64::from(len) * 4).expect("row");
            let st = gpu.uniform("step", &StepParams::new(0, 1));
            let writer = MatVec::new(
                &gpu,
                &writer_w,
                &x,
                &row,
                &st,
                MatVecOptions {
                    layout,
                    handoff_out: Some((&handoff, None)),
                    ..Default::default()
                },
            )
            .expect("writer");
            if !writer.hands_off() {
                continue;
            }
            handed_off += 1;
            let ys = [0, 1].map(|_| gpu.storage("y", u64::from(n_out) * 4).expect("y"));
            let readers = [Some(&handoff), None].map(|handoff_in| {
                MatVec::new(
                    &gpu,
                    &reader_w,
                    &row,
                    &ys[usize::from(handoff_in.is_none())],
                    &st,
                    MatVecOptions {
                        layout: fine,
                        handoff_in,
                        ..Default::default()
                    },
                )
                .expect("reader")
            });
            assert!(readers[0].reads_handoff() && !readers[1].reads_handoff());
            assert_eq!(readers[0].int8_levels(), 2);
            let mut rec = Recorder::new(&gpu);
            writer.encode(&mut rec);
            readers.iter().for_each(|r| r.encode(&mut rec));
            rec.submit();
            let bound = step_bound(&reader_host, &read(&gpu, &row, len as usize), 127.0);
            assert_within(
                &format!("{reader_ty:?} two levels from {layout:?}"),
                &read(&gpu, &ys[0], n_out as usize),
                &read(&gpu, &ys[1], n_out as usize),
                &bound,
            );
        }
    }
    assert!(handed_off >= 1, "no writer handed off");
}

/// A router-like product (f32 rows, the RMSNorm fused) hands off the normalised input it
/// stages, in one level and in two, and a reader without the norm reading it matches the
/// reader that normalises and quantizes the row itself; the router's own outputs do not
/// change.
#[test]
fn a_product_hands_its_normalised_input_off() {
    let gpu = gpu();
    let mut rng = Rng::new(78);
    let (len, experts, n_out) = (192u32, 7u32, 29u32);
    let x = gpu
        .storage_from("x", &rng.vec(2 * len as usize, 2.0))
        .expect("x");
    let gains: Vec<f32> = (0..len).map(|_| 0.5 + rng.uniform()).collect();
    let gain = gpu.storage_from("gains", &gains).expect("gains");
    let norm = Some((NormKind::Rms, &gain, None, 1e-5));
    // The second of two token rows is the one read.
    let st = gpu.uniform("step", &StepParams::new(0, 2));
    let router = Matrix::from_f32(
        &gpu,
        "router",
        &rng.vec((experts * len) as usize, 1.0),
        experts,
        len,
        WeightDType::F32,
    )
    .expect("router");
    for (levels, reader_ty) in [(1, GgmlType::Q4_0), (2, GgmlType::Mxfp4)] {
        let handoff = Int8Handoff::with_rows(&gpu, len, 1, levels).expect("handoff");
        let logits = [0, 1].map(|_| gpu.storage("logits", u64::from(experts) * 4).expect("y"));
        let routers = [Some(&handoff), None].map(|handoff_input| {
            MatVec::new(
                &gpu,
                &router,
                &x,
                &logits[usize::from(handoff_input.is_none())],
                &st,
                MatVecOptions {
                    norm,
                    handoff_input,
                    layout: MatVecLayout::for_dtype(WeightDType::F32),
                    ..Default::default()
                },
            )
            .expect("router")
        });
        assert!(routers[0].hands_off() && !routers[1].hands_off());
        let (reader_w, reader_host) =
            matrix(&gpu, &mut rng, Storage::Blocks(reader_ty), n_out, len, &[]);
        let layout = MatVecLayout {
            int8_fine: Some(levels == 2),
            ..Default::default()
        };
        let ys = [0, 1].map(|_| gpu.storage("y", u64::from(n_out) * 4).expect("y"));
        let via_handoff = MatVec::new(
            &gpu,
            &reader_w,
            &x,
            &ys[0],
            &st,
            MatVecOptions {
                handoff_in: Some(&handoff),
                layout,
                ..Default::default()
            },
        )
        .expect("reader");
        let staged = MatVec::new(
            &gpu,
            &reader_w,
            &x,
            &ys[1],
            &st,
            MatVecOptions {
                norm,
                layout,
                ..Default::default()
            },
        )
        .expect("reader");
        assert!(via_handoff.reads_handoff());
        assert_eq!(via_handoff.int8_levels(), levels);
        let mut rec = Recorder::new(&gpu);
        routers.iter().for_each(|r| r.encode(&mut rec));
        via_handoff.encode(&mut rec);
        staged.encode(&mut rec);
        rec.submit();
        assert_eq!(
            read(&gpu, &logits[0], experts as usize),
            read(&gpu, &logits[1], experts as usize),
            "the router's outputs changed"
        );
        let raw = read(&gpu, &x, 2 * len as usize)[len as usize..].to_vec();
        let inv = 1.0 / (raw.iter().map(|v| v * v).sum::<f32>() / len as f32 + 1e-5).sqrt();
        let normed: Vec<f32> = raw.iter().zip(&gains).map(|(v, g)| v * inv * g).collect();
        // Rounded once each way, from values a float rounding apart: a value may round a step
        // apart where it straddles a boundary (the second level taking up a first level's).
        let divisor = if levels == 2 { 127.0 } else { 1.0 };
        assert_within(
            &format!("{reader_ty:?} reading the router's input in {levels} levels"),
            &read(&gpu, &ys[0], n_out as usize),
            &read(&gpu, &ys[1], n_out as usize),
            &flip_bound(&reader_host, &normed, divisor),
        );
    }
}
