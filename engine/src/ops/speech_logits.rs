use bytemuck::{Pod, Zeroable};

use super::bind;
use crate::gpu::{Gpu, GpuError, Kernel, Recorder, StorageBuffer, UniformBuffer};

const SOURCE: &str = include_str!("../../../shaders/speech_logits.wgsl");
const WG: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    vocab: u32,
    eot: u32,
    ts_begin: u32,
    no_timestamps: u32,
    begin_index: u32,
    max_initial: u32,
    n_suppress: u32,
    n_begin_suppress: u32,
    temperature: f32,
    _pad: [u32; 3],
}

/// The token ids the rules need.
#[derive(Clone, Copy, Debug)]
pub struct SpeechTokenIds {
    pub vocab: u32,
    pub eot: u32,
    pub no_timestamps: u32,
    /// The first timestamp id (`<|0.00|>`).
    pub timestamp_begin: u32,
}

/// What one decoding pass asks of the rules.
#[derive(Clone, Debug, Default)]
pub struct SpeechRules {
    pub timestamps: bool,
    /// History index of the first generated token (the prompt's length).
    pub begin_index: u32,
    /// Largest first timestamp, in timestamp steps from `<|0.00|>`.
    pub max_initial_timestamp: Option<u32>,
    pub suppress: Vec<u32>,
    pub begin_suppress: Vec<u32>,
    /// The sampler's temperature (for the log-probabilities; 0 = greedy).
    pub temperature: f32,
}

/// Whisper's logit rules (suppressed tokens, timestamp pairing and monotonicity, initial
/// timestamp, timestamp mass) applied in place before sampling, and the log-probability of
/// each sampled token after it.
pub struct SpeechLogits {
    rules: Kernel,
    rules_group: wgpu::BindGroup,
    score: Kernel,
    score_group: wgpu::BindGroup,
    params: UniformBuffer,
    suppress: StorageBuffer,
    capacity: u32,
    ids: SpeechTokenIds,
}

/// Room for suppressed ids (Whisper's lists hold about 90).
const MAX_SUPPRESSED: u32 = 1024;

impl SpeechLogits {
    pub fn new(
        gpu: &Gpu,
        ids: SpeechTokenIds,
        logits: &StorageBuffer,
        history: &StorageBuffer,
        scores: &StorageBuffer,
        step: &UniformBuffer,
    ) -> Result<Self, GpuError> {
        let defines = [("WG", WG.to_string())];
        let rules = gpu.kernel("speech_logits", SOURCE, "main", &defines)?;
        let score = gpu.kernel("speech_logits", SOURCE, "score", &defines)?;
        let params = gpu.uniform("speech rules", &Self::pack(ids, &SpeechRules::default(), 0));
        let suppress = gpu.storage("suppressed tokens", u64::from(MAX_SUPPRESSED) * 4)?;
        let stats = gpu.storage("logit stats", 16)?;
        let rules_group = bind(
            gpu,
            &rules,
            &[
                (0, &params.buffer),
                (1, &step.buffer),
                (2, &logits.buffer),
                (3, &history.buffer),
                (4, &suppress.buffer),
                (5, &stats.buffer),
            ],
        );
        let score_group = bind(
            gpu,
            &score,
            &[
                (0, &params.buffer),
                (1, &step.buffer),
                (2, &logits.buffer),
                (3, &history.buffer),
                (5, &stats.buffer),
                (6, &scores.buffer),
            ],
        );
        Ok(Self {
            rules,
            rules_group,
            score,
            score_group,
            params,
            suppress,
            capacity: MAX_SUPPRESSED,
            ids,
        })
    }

    fn pack(ids: SpeechTokenIds, rules: &SpeechRules, n_suppress: u32) -> Params {
        let greedy = rules.temperature <= 0.0 || !rules.temperature.is_finite();
        Params {
            vocab: ids.vocab,
            eot: ids.eot,
            ts_begin: if rules.timestamps {
                ids.timestamp_begin
            } else {
                0
            },
            no_timestamps: ids.no_timestamps,
            begin_index: rules.begin_index,
            max_initial: rules.max_initial_timestamp.unwrap_or(u32::MAX),
            n_suppress,
            n_begin_suppress: (rules.begin_suppress.len() as u32).min(MAX_SUPPRESSED - n_suppress),
            temperature: if greedy { 1.0 } else { rules.temperature },
            _pad: [0; 3],
        }
    }

    /// Sets the rules for the following submissions.
    pub fn set(&self, gpu: &Gpu, rules: &SpeechRules) {
        let n_suppress = (rules.suppress.len() as u32).min(self.capacity);
        let mut list: Vec<u32> = rules.suppress[..n_suppress as usize].to_vec();
        list.extend(rules.begin_suppress.iter().copied());
        list.truncate(self.capacity as usize);
        if list.is_empty() {
            list.push(u32::MAX);
        }
        gpu.queue()
            .write_buffer(&self.suppress.buffer, 0, bytemuck::cast_slice(&list));
        self.params
            .write(gpu, &Self::pack(self.ids, rules, n_suppress));
    }

    /// Records the rules (before the sampler).
    pub fn encode_rules(&self, rec: &mut Recorder<'_>) {
        rec.dispatch_xyz(&self.rules, &self.rules_group, [1, 1, 1]);
    }

    /// Records the scoring of the sampled token (after the sampler).
    pub fn encode_score(&self, rec: &mut Recorder<'_>) {
        rec.dispatch_xyz(&self.score, &self.score_group, [1, 1, 1]);
    }
}
