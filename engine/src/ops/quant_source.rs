//! Expands the sub-block decoding template of shaders/quant.wgsl (written once, with
//! `EMIT(j; value);` lines) into the functions kernels use: `q_dot`, `q_store` and `q_gather`.

use std::sync::LazyLock;

const QUANT: &str = include_str!("../../../shaders/quant.wgsl");

fn expand(emit: impl Fn(&str, &str) -> String) -> String {
    let begin = QUANT
        .find("/*Q_DECODE_BEGIN")
        .map(|i| i + "/*Q_DECODE_BEGIN".len());
    let end = QUANT.find("Q_DECODE_END*/");
    let (Some(begin), Some(end)) = (begin, end) else {
        return String::new();
    };
    QUANT[begin..end]
        .lines()
        .map(|line| {
            let trimmed = line.trim_start();
            match trimmed
                .strip_prefix("EMIT(")
                .and_then(|rest| rest.strip_suffix(");"))
                .and_then(|rest| rest.split_once("; "))
            {
                Some((index, value)) => {
                    let indent = &line[..line.len() - trimmed.len()];
                    format!("{indent}{}\n", emit(index, value))
                }
                None => format!("{line}\n"),
            }
        })
        .collect()
}

/// quant.wgsl with its template expanded and the template itself removed.
pub(super) fn quant_source() -> String {
    let dot = expand(|j, v| format!("acc += dot({v}, xin4(xbase, 32u * s + 4u * ({j})));"));
    let store = expand(|j, v| {
        format!(
            "{{ let q4 = {v}; staged[out + 2u * ({j})] = pack2x16float(q4.xy); staged[out + 2u * ({j}) + 1u] = pack2x16float(q4.zw); }}"
        )
    });
    let gather = expand(|j, v| {
        format!(
            "{{ let q4 = {v}; let at = out + 4u * ({j}); x[at] = q4.x; x[at + 1u] = q4.y; x[at + 2u] = q4.z; x[at + 3u] = q4.w; }}"
        )
    });
    let without_template = match QUANT.find("/*Q_DECODE_BEGIN") {
        Some(i) => &QUANT[..i],
        None => QUANT,
    };
    without_template
        .replace("Q_DECODE_DOT\n", &dot)
        .replace("Q_DECODE_STORE\n", &store)
        .replace("Q_DECODE_GATHER\n", &gather)
}

/// The quantized decode product: quant.wgsl expanded, then matvec.wgsl (and its handoff).
pub static QUANT_MATVEC: LazyLock<String> =
    LazyLock::new(|| quant_source() + super::matvec::SOURCE);

/// The routed experts' products over block-quantized experts: quant.wgsl expanded, then
/// moe.wgsl.
pub static QUANT_MOE: LazyLock<String> = LazyLock::new(|| quant_source() + super::moe::SOURCE);

/// The routed experts' prompt products on tensor cores over block-quantized experts.
pub static QUANT_MOE_COOP: LazyLock<String> =
    LazyLock::new(|| quant_source() + super::moe::COOP_SOURCE.as_str());

/// Expansion of a quantized matrix to dense f16: quant.wgsl expanded, then dequant.wgsl.
pub static QUANT_DEQUANT: LazyLock<String> =
    LazyLock::new(|| quant_source() + include_str!("../../../shaders/dequant.wgsl"));

/// Embedding gather from a block-quantized table: quant.wgsl expanded, then embed_q.wgsl.
pub static QUANT_EMBED: LazyLock<String> =
    LazyLock::new(|| quant_source() + include_str!("../../../shaders/embed_q.wgsl"));

/// The quantized prompt product: quant.wgsl expanded, then the SIMT tiles.
pub static QUANT_MATMUL: LazyLock<String> =
    LazyLock::new(|| quant_source() + super::matmul::SIMT_SOURCE.as_str());

/// The few-row product over block-quantized weights: quant.wgsl expanded, then few_rows.wgsl.
pub(crate) static QUANT_FEW_ROWS: LazyLock<String> =
    LazyLock::new(|| quant_source() + super::few_rows::SOURCE.as_str());

/// The quantized prompt product on tensor cores: quant.wgsl expanded, then the coop tiles.
pub static QUANT_MATMUL_COOP: LazyLock<String> =
    LazyLock::new(|| quant_source() + super::matmul::COOP_SOURCE.as_str());

/// The quantized prompt product on CPU adapters: quant.wgsl expanded, then the CPU tiles.
pub static QUANT_MATMUL_CPU: LazyLock<String> =
    LazyLock::new(|| quant_source() + super::matmul::CPU_SOURCE.as_str());

#[cfg(test)]
mod tests {
    #[test]
    fn every_emit_is_expanded() {
        for source in [
            super::QUANT_MATVEC.as_str(),
            super::QUANT_MATMUL.as_str(),
            super::QUANT_MATMUL_COOP.as_str(),
            super::QUANT_MATMUL_CPU.as_str(),
        ] {
            let starts = |prefix: &str| source.lines().any(|l| l.trim_start().starts_with(prefix));
            assert!(!starts("EMIT("));
            assert!(!starts("Q_DECODE") && !source.contains("/*Q_DECODE"));
            assert!(source.contains("acc += dot("));
            assert!(source.contains("staged[out + 2u * ("));
        }
    }
}
