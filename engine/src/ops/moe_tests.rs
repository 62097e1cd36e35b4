//! The expert products' tile choice and the tensor-core tiles' translation.

use super::*;
use crate::load::GgmlType;
use crate::ops::{WeightDType, quant_defines};

/// The tile taken: the fastest measured where it fits, smaller ones on adapters with less
/// workgroup memory, SIMT tiles without tensor cores.
#[test]
fn prompt_tiles_fall_back_to_what_fits() {
    let mut caps = nvidia_caps();
    assert_eq!(prompt_form(&caps, true, None).tile(), (128, 64));
    caps.max_workgroup_storage = 32 * 1024;
    assert_eq!(prompt_form(&caps, true, None).tile(), (64, 64));
    caps.max_workgroup_storage = 16 * 1024;
    assert_eq!(prompt_form(&caps, false, None).tile(), (64, 64));
    assert!(matches!(prompt_form(&caps, true, None), Form::Tiled));
    caps.max_workgroup_storage = 48 * 1024;
    // A forced tile comes first where it fits, and is passed over where it does not.
    assert_eq!(prompt_form(&caps, true, Some("2x2/1x2")).tile(), (64, 32));
    assert_eq!(prompt_form(&caps, true, Some("8x8/4x4")).tile(), (128, 64));
    caps.cooperative_matrix = false;
    assert!(matches!(prompt_form(&caps, false, None), Form::Tiled));
}

fn nvidia_caps() -> GpuCaps {
    crate::ops::coop_tile::tests::nvidia_caps(1024)
}

/// The tensor-core expert tiles only compile on adapters with cooperative matrices, which
/// CI's software adapter lacks: naga checks each weight form, both sides and the tile
/// layouts here (parse, validation, SPIR-V).
#[test]
fn tensor_core_expert_tiles_translate_in_every_variant() {
    let caps = nvidia_caps();
    let cols = 96;
    let mut weights: Vec<(bool, Vec<_>, u32)> = [WeightDType::F32, WeightDType::F16]
        .iter()
        .map(|d| (false, d.defines(), cols / d.per_vec4()))
        .collect();
    for ty in [
        GgmlType::Mxfp4,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ] {
        weights.push((true, quant_defines(ty, cols), 0));
    }
    let mut checked = 0;
    for (quantized, defines, row_vecs) in &weights {
        for (i, tile) in ["2x2/1x2", "2x2/2x2", "2x4/2x2", "4x2/1x1/64"]
            .iter()
            .enumerate()
        {
            let tile: CoopTile = tile.parse().expect("tile");
            let side = ProductSide {
                glu: i % 2 == 0,
                clamped: i == 2,
                per_token: i % 2 == 0,
                top_k: "4",
                form: Form::Coop(tile),
            };
            assert!(coop_workgroup_bytes(&tile, side.glu) <= caps.max_workgroup_storage);
            assert!(staging_passes(&tile, side.glu, 32).is_some());
            let all = product_defines(
                defines.clone(),
                *row_vecs,
                cols / 32,
                &side,
                i != 3,
                i != 1,
                &caps,
            );
            crate::gpu::assert_translates(product_source(*quantized, side.form), &all, &["main"]);
            checked += 1;
        }
    }
    assert_eq!(checked, 6 * 4);
}
