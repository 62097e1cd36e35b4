//! CPU dequantizers and quantizers against gguf-py on known blocks
//! (tests/fixtures/quant/blocks.json, made by tests/reference/make_quant_blocks.py):
//! bit-exact, signed zeros included.

use std::path::PathBuf;

use backpack_engine::load::GgmlType;
use backpack_engine::load::quant::{dequantize, quantize_q4_0, quantize_q8_0};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    dequantize: Vec<Record>,
    quantize: Vec<Record>,
}

#[derive(Deserialize)]
struct Record {
    #[serde(rename = "type")]
    ty: String,
    ggml_type_id: u32,
    case: String,
    bytes_hex: String,
    values: Vec<f64>,
    input: Option<Vec<f64>>,
}

fn fixture() -> Fixture {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/quant/blocks.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture parses")
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn dequantizers_match_gguf_py_bit_for_bit() {
    let f = fixture();
    let mut types = std::collections::HashSet::new();
    for r in &f.dequantize {
        let ty = GgmlType::from_id(r.ggml_type_id).expect("known type");
        assert_eq!(ty.name(), r.ty);
        types.insert(r.ty.clone());
        let bytes = hex(&r.bytes_hex);
        let mut out = vec![0.0f32; r.values.len()];
        dequantize(ty, &bytes, &mut out);
        for (i, (got, want)) in out.iter().zip(&r.values).enumerate() {
            let want = *want as f32;
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{} {} element {i}: {got} vs {want}",
                r.ty,
                r.case
            );
        }
    }
    assert_eq!(
        types.len(),
        12,
        "every supported type is covered: {types:?}"
    );
}

#[test]
fn quantizers_match_gguf_py() {
    let f = fixture();
    for r in f
        .quantize
        .iter()
        .filter(|r| r.ty == "Q8_0" || r.ty == "Q4_0")
    {
        let input: Vec<f32> = r
            .input
            .as_ref()
            .expect("input")
            .iter()
            .map(|v| *v as f32)
            .collect();
        let mut out = Vec::new();
        match r.ty.as_str() {
            "Q8_0" => quantize_q8_0(&input, &mut out),
            _ => quantize_q4_0(&input, &mut out),
        }
        assert_eq!(out, hex(&r.bytes_hex), "{} {}", r.ty, r.case);
    }
}
