//! Translation checks of the tensor-core tiles (matmul_coop.wgsl), whose variants CI's
//! software adapter cannot compile into pipelines.

use super::*;
use crate::load::GgmlType;

/// The tensor-core tiles only compile on adapters with cooperative matrices, which CI's
/// software adapter lacks: naga checks every variant here (parse, validation, SPIR-V).
#[test]
fn tensor_core_tiles_translate_in_every_variant() {
    let dense = [WeightDType::F32, WeightDType::F16].map(|d| (COOP_SOURCE.as_str(), d.defines()));
    let quant = [
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ]
    .map(|ty| {
        let source = super::super::quant_source::QUANT_MATMUL_COOP.as_str();
        (source, super::super::quant_defines(ty, 512))
    });
    let mut checked = 0;
    for (source, base) in dense.iter().chain(&quant) {
        let raw = base.iter().any(|(k, v)| *k == "F16" && v == "1");
        for (tile, split, conv) in [
            ("2x2/4x4", false, false),
            ("4x4/2x2", true, false),
            ("4x2/2x2", false, true),
            ("2x2/4x2", true, true),
            ("4x4/2x2/64", false, false),
            ("4x2/2x2/64", true, true),
            ("4x4/2x4", false, true),
            ("4x4/4x2", true, false),
        ] {
            let tile: CoopTile = tile.parse().expect("tile");
            let mut defines = base.clone();
            defines.extend(tile.defines(32));
            defines.extend([
                flag("WRAW", raw),
                // Convolutions both ways: eights of one tap (XV) or value by value.
                flag("XV", !conv || split),
                flag("BIAS", true),
                flag("RESIDUAL", !split),
                flag("SPLIT_K", split),
                flag("REDUCE_V4", split && !conv),
                flag("CONV", conv),
                // A folded GroupNorm where convolutions load eights.
                flag("NORM_IN", conv && split),
                flag("RELU", false),
                flag("BIG", false),
            ]);
            defines.extend(gelu_flags(None));
            let entries = ["main", "reduce"];
            crate::gpu::assert_translates(source, &defines, &entries[..1 + usize::from(split)]);
            checked += 1;
        }
    }
    assert_eq!(checked, 7 * 8);
    // Gating in the epilogue (GLU), split and not, halved epilogues (64-deep steps)
    // included, in each form.
    let gates = [
        (GluKind::Silu, "4x4/2x2", false, true),
        (GluKind::GeluTanh, "2x2/4x4", true, false),
        (GluKind::GeluErf, "4x4/2x2/64", false, true),
        (GluKind::Silu, "4x4/2x4", true, true),
        (GluKind::Silu, "4x2/2x2/64", true, false),
    ];
    for (i, (kind, tile, split, bias)) in gates.into_iter().enumerate() {
        let (source, base) = if i % 2 == 0 { &dense[1] } else { &quant[3] };
        let raw = base.iter().any(|(k, v)| *k == "F16" && v == "1");
        let tile: CoopTile = tile.parse().expect("tile");
        let mut defines = base.clone();
        defines.extend(tile.defines(32));
        defines.extend(kind.defines());
        defines.extend([
            flag("GLU", true),
            flag("WRAW", raw),
            flag("XV", true),
            flag("BIAS", bias),
            flag("SPLIT_K", split),
            flag("REDUCE_V4", split && i % 3 == 0),
        ]);
        defines.extend(gelu_flags(None));
        let entries = ["main", "reduce"];
        crate::gpu::assert_translates(source, &defines, &entries[..1 + usize::from(split)]);
    }
    // f16 outputs (never split, no residual) and f16 X, with and without the epilogue's GELU.
    for (i, tile) in ["4x4/2x2", "4x4/2x2/64", "4x4/2x4", "2x2/4x4"]
        .into_iter()
        .enumerate()
    {
        let (source, base) = if i % 2 == 0 { &dense[1] } else { &quant[3] };
        let raw = base.iter().any(|(k, v)| *k == "F16" && v == "1");
        let tile: CoopTile = tile.parse().expect("tile");
        let mut defines = base.clone();
        defines.extend(tile.defines(32));
        defines.extend([
            flag("HALF_OUT", i != 3),
            flag("HALF_IN", i != 0),
            flag("WRAW", raw),
            flag("XV", i == 0),
            flag("BIAS", true),
            flag("RESIDUAL", i == 3),
        ]);
        defines.extend(gelu_flags((i < 2).then_some(Gelu::Erf)));
        crate::gpu::assert_translates(source, &defines, &["main"]);
    }
}
