//! Whisper's log-mel spectrogram, computed as transformers' `WhisperFeatureExtractor` does on its
//! numpy path: centred 400-sample frames (reflect padding) every 160 samples, periodic Hann
//! window, power spectrum, Slaney mel filters, log10, clamped to 8 below the maximum, scaled.

use std::f64::consts::PI;
use std::sync::Arc;

use realfft::{RealFftPlanner, RealToComplex};

use super::SAMPLE_RATE;

/// Samples per FFT frame (25 ms).
pub const N_FFT: usize = 400;
/// Samples between frames (10 ms).
pub const HOP_LENGTH: usize = 160;
/// Frequency bins of one frame's spectrum.
const N_FREQS: usize = N_FFT / 2 + 1;
/// Mel energies are floored here before the log, as transformers does.
const MEL_FLOOR: f64 = 1e-10;

/// The filters, window and FFT plan for one mel size (80 or 128); build once, reuse.
pub struct LogMel {
    n_mels: usize,
    /// `[n_mels][N_FREQS]`, as transformers' `mel_filter_bank(...).T`.
    filters: Vec<f64>,
    /// The bins where each filter is non-zero, to skip the rest.
    spans: Vec<(usize, usize)>,
    window: Vec<f64>,
    /// f64 like numpy's FFT: each bin then matches to its own precision, not the frame's.
    fft: Arc<dyn RealToComplex<f64>>,
}

impl std::fmt::Debug for LogMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMel")
            .field("n_mels", &self.n_mels)
            .finish()
    }
}

/// A log-mel spectrogram, `[n_mels][frames]` (mel-major, like transformers' `input_features`).
#[derive(Clone, Debug, PartialEq)]
pub struct MelFeatures {
    pub n_mels: usize,
    pub frames: usize,
    pub data: Vec<f32>,
}

impl MelFeatures {
    /// The values of mel band `mel` over all frames; empty when out of range.
    pub fn row(&self, mel: usize) -> &[f32] {
        self.data
            .get(mel * self.frames..(mel + 1) * self.frames)
            .unwrap_or(&[])
    }

    /// `[n_mels][len]` starting at `start_frame`, zero past the end: zero is what transformers
    /// pads normalized features with when a 3000-frame window runs past the audio.
    pub fn window(&self, start_frame: usize, len: usize) -> Vec<f32> {
        let mut out = vec![0.0; self.n_mels * len];
        let start = start_frame.min(self.frames);
        let take = len.min(self.frames - start);
        for (mel, dst) in out
            .chunks_exact_mut(len.max(1))
            .enumerate()
            .take(self.n_mels)
        {
            if let Some(src) = self.row(mel).get(start..start + take) {
                dst[..take].copy_from_slice(src);
            }
        }
        out
    }
}

impl LogMel {
    pub fn new(n_mels: usize) -> Self {
        let filters = filter_bank(n_mels);
        let spans = filters
            .chunks_exact(N_FREQS)
            .map(|row| {
                let lo = row.iter().position(|&w| w != 0.0).unwrap_or(0);
                let hi = row.iter().rposition(|&w| w != 0.0).map_or(lo, |i| i + 1);
                (lo, hi)
            })
            .collect();
        // np.hanning(401)[:-1], in numpy's own formula: 0.5 + 0.5 cos(pi n / 400), n = -400, -398, ...
        let window = (0..N_FFT)
            .map(|k| {
                let n = 2.0 * k as f64 - N_FFT as f64;
                0.5 + 0.5 * (PI * n / N_FFT as f64).cos()
            })
            .collect();
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT);
        Self {
            n_mels,
            filters,
            spans,
            window,
            fft,
        }
    }

    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// The filter bank, `[n_mels][201]` row-major.
    pub fn filters(&self) -> &[f64] {
        &self.filters
    }

    /// The log-mel spectrogram of 16 kHz mono `samples`, zero-padded to at least `min_samples`
    /// (480 000 for one 30 s Whisper window; 0 to follow the audio). `len / 160` frames.
    pub fn compute(&self, samples: &[f32], min_samples: usize) -> MelFeatures {
        let len = samples.len().max(min_samples);
        let frames = len / HOP_LENGTH;
        let mut data = vec![0.0f32; self.n_mels * frames];
        if frames == 0 {
            return MelFeatures {
                n_mels: self.n_mels,
                frames,
                data,
            };
        }
        let padded = reflect_pad(samples, len);
        let mut input = self.fft.make_input_vec();
        let mut spectrum = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut power = [0.0f64; N_FREQS];
        // len + 1 centred frames; the last is dropped, as transformers does.
        let windows = padded.windows(N_FFT).step_by(HOP_LENGTH).take(frames);
        for (t, frame) in windows.enumerate() {
            for ((x, s), w) in input.iter_mut().zip(frame).zip(&self.window) {
                *x = s * w;
            }
            // Buffer sizes come from the plan itself, so this does not fail.
            if self
                .fft
                .process_with_scratch(&mut input, &mut spectrum, &mut scratch)
                .is_err()
            {
                break;
            }
            for (p, c) in power.iter_mut().zip(&spectrum) {
                // numpy stores the spectrum as complex64 before taking the power: round alike.
                let (re, im) = (f64::from(c.re as f32), f64::from(c.im as f32));
                *p = re * re + im * im;
            }
            let rows = self.filters.chunks_exact(N_FREQS).zip(&self.spans);
            for (mel, (row, &(lo, hi))) in rows.enumerate() {
                let energy: f64 = row[lo..hi]
                    .iter()
                    .zip(&power[lo..hi])
                    .map(|(w, p)| w * p)
                    .sum();
                data[mel * frames + t] = energy.max(MEL_FLOOR).log10() as f32;
            }
        }
        let max = data.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let floor = max - 8.0;
        for v in &mut data {
            *v = ((*v).max(floor) + 4.0) / 4.0;
        }
        MelFeatures {
            n_mels: self.n_mels,
            frames,
            data,
        }
    }
}

/// `samples` zero-padded to `len`, then 200 samples of `np.pad(mode="reflect")` each side (the
/// edge sample is not repeated; shorter signals reflect back and forth, a single sample repeats).
fn reflect_pad(samples: &[f32], len: usize) -> Vec<f64> {
    let half = N_FFT / 2;
    let value = |i: usize| samples.get(i).map_or(0.0, |&s| f64::from(s));
    let mut out = Vec::with_capacity(len + N_FFT);
    out.extend((0..half).map(|k| value(reflect_index(k as i64 - half as i64, len))));
    out.extend((0..len).map(value));
    out.extend((0..half).map(|k| value(reflect_index((len + k) as i64, len))));
    out
}

/// Where index `j` of the endlessly reflected signal of length `len` (> 0) reads from.
fn reflect_index(j: i64, len: usize) -> usize {
    if len <= 1 {
        return 0;
    }
    let last = len as i64 - 1;
    let m = j.rem_euclid(2 * last);
    (if m > last { 2 * last - m } else { m }) as usize
}

const MIN_LOG_HZ: f64 = 1000.0;
const MIN_LOG_MEL: f64 = 15.0;

/// Slaney's mel scale: linear below 1 kHz, logarithmic above.
fn hz_to_mel(hz: f64) -> f64 {
    if hz >= MIN_LOG_HZ {
        MIN_LOG_MEL + (hz / MIN_LOG_HZ).ln() * (27.0 / 6.4f64.ln())
    } else {
        3.0 * hz / 200.0
    }
}

fn mel_to_hz(mel: f64) -> f64 {
    if mel >= MIN_LOG_MEL {
        MIN_LOG_HZ * ((6.4f64.ln() / 27.0) * (mel - MIN_LOG_MEL)).exp()
    } else {
        200.0 * mel / 3.0
    }
}

/// transformers' `mel_filter_bank(201, n_mels, 0, 8000, 16000, norm="slaney",
/// mel_scale="slaney")`, transposed to `[n_mels][201]`, with numpy's order of operations.
fn filter_bank(n_mels: usize) -> Vec<f64> {
    let nyquist = f64::from(SAMPLE_RATE / 2);
    let (mel_min, mel_max) = (hz_to_mel(0.0), hz_to_mel(nyquist));
    // np.linspace: start + i * step, with the end point set exactly.
    let points = n_mels + 2;
    let step = (mel_max - mel_min) / (points - 1) as f64;
    let edges: Vec<f64> = (0..points)
        .map(|i| {
            let mel = if i == points - 1 {
                mel_max
            } else {
                i as f64 * step + mel_min
            };
            mel_to_hz(mel)
        })
        .collect();
    let diff: Vec<f64> = edges.windows(2).map(|w| w[1] - w[0]).collect();
    let bin_hz = nyquist / (N_FREQS - 1) as f64;
    let mut filters = vec![0.0; n_mels * N_FREQS];
    for (m, row) in filters.chunks_exact_mut(N_FREQS).enumerate() {
        let enorm = 2.0 / (edges[m + 2] - edges[m]);
        for (i, w) in row.iter_mut().enumerate() {
            let hz = i as f64 * bin_hz;
            let down = -(edges[m] - hz) / diff[m];
            let up = (edges[m + 2] - hz) / diff[m + 1];
            *w = 0.0f64.max(down.min(up)) * enorm;
        }
    }
    filters
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signal the reference values below were computed from (transformers 5.23, numpy 2.4).
    fn test_signal(len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let n = i as f64;
                let x = 0.5 * (2.0 * PI * 440.0 * n / 16000.0).sin()
                    + 0.25 * (2.0 * PI * 3000.0 * n / 16000.0 + 0.3).sin()
                    + 0.01 * (n * n * 1e-3).sin();
                x as f32
            })
            .collect()
    }

    /// Asserts `[mel][frame]` values and the total against transformers' output.
    fn check(mel: &MelFeatures, points: &[(usize, usize, f64)], total: f64) {
        for &(m, t, want) in points {
            let got = f64::from(mel.data[m * mel.frames + t]);
            assert!((got - want).abs() < 1e-4, "[{m}][{t}]: {got} vs {want}");
        }
        let sum: f64 = mel.data.iter().map(|&v| f64::from(v)).sum();
        assert!((sum - total).abs() < 1e-2, "sum {sum} vs {total}");
    }

    #[test]
    fn filter_bank_matches_transformers() {
        for (n_mels, total, first) in [
            (80, 1.9990241029178577, 0.024862593984176087),
            (128, 3.1909855285406996, 0.012373986332636965),
        ] {
            let mel = LogMel::new(n_mels);
            let filters = mel.filters();
            assert_eq!(filters.len(), n_mels * 201);
            let sum: f64 = filters.iter().sum();
            assert!((sum - total).abs() < 1e-12, "{n_mels}: {sum}");
            // Filter 0 at bin 1 (40 Hz).
            assert!((filters[1] - first).abs() < 1e-15, "{n_mels}");
            // Slaney normalization: each wide filter has unit area in Hz.
            for row in filters.chunks_exact(201).skip(n_mels / 2) {
                let area = row.iter().sum::<f64>() * 40.0;
                assert!((area - 1.0).abs() < 0.1, "{n_mels}: {area}");
            }
        }
    }

    #[test]
    fn matches_transformers() {
        let mel = LogMel::new(80).compute(&test_signal(4000), 0);
        assert_eq!((mel.n_mels, mel.frames), (80, 25));
        let points = [
            (0, 0, 1.0082014799118042),
            (7, 24, 0.5273950695991516),
            (21, 0, 0.7475038766860962),
            (28, 24, 0.07000160217285156),
            (42, 0, 0.29937243461608887),
            (49, 24, -0.02573251724243164),
            (63, 0, 0.480495810508728),
            (70, 24, -0.22625064849853516),
            (79, 7, -0.5605596303939819),
        ];
        check(&mel, &points, -404.01633977890015);

        let mel = LogMel::new(128).compute(&test_signal(4000), 0);
        assert_eq!((mel.n_mels, mel.frames), (128, 25));
        let points = [
            (0, 0, 0.932442307472229),
            (14, 24, 0.5318945646286011),
            (49, 24, 0.0007778406143188477),
            (84, 24, 0.219527006149292),
            (112, 6, 0.14892178773880005),
            (126, 0, 0.25409114360809326),
        ];
        check(&mel, &points, -624.0015560984612);
    }

    #[test]
    fn padding_and_short_signals_match_transformers() {
        let logmel = LogMel::new(80);
        // Zero-padded to 3200 samples.
        let mel = logmel.compute(&test_signal(1000), 3200);
        assert_eq!(mel.frames, 20);
        let points = [(40, 6, 0.10947579145431519), (60, 1, 0.07302635908126831)];
        check(&mel, &points, -500.0350204706192);
        // 170 samples: shorter than the 200 reflected, so the reflection bounces.
        let short: Vec<f32> = (0..170)
            .map(|i| (0.3 * (i as f64 * 0.2).sin()) as f32)
            .collect();
        let mel = logmel.compute(&short, 0);
        assert_eq!(mel.frames, 1);
        let points = [
            (0, 0, 0.8217755556106567),
            (10, 0, 1.1022768020629883),
            (50, 0, 0.16896528005599976),
            (79, 0, -0.16022825241088867),
        ];
        check(&mel, &points, 32.15682178735733);
        // One sample, padded to 800.
        let mel = logmel.compute(&[0.7], 800);
        assert_eq!(mel.frames, 5);
        let points = [(0, 0, 0.5214356184005737), (40, 2, -1.4696602821350098)];
        check(&mel, &points, -310.0069051384926);
        // Too short for a frame.
        assert_eq!(logmel.compute(&[0.5; 100], 0).frames, 0);
        assert_eq!(logmel.compute(&[], 0).data.len(), 0);
    }

    #[test]
    fn silence_is_constant() {
        let mel = LogMel::new(80).compute(&[], 480_000);
        assert_eq!((mel.n_mels, mel.frames), (80, 3000));
        // log10(1e-10) = -10 everywhere, so the maximum is -10 too: (-10 + 4) / 4.
        assert!(mel.data.iter().all(|&v| v == -1.5));
    }

    #[test]
    fn sine_1khz_lands_in_its_band() {
        let logmel = LogMel::new(80);
        let sine: Vec<f32> = (0..16_000)
            .map(|i| (0.5 * (2.0 * PI * 1000.0 * i as f64 / 16000.0).sin()) as f32)
            .collect();
        let mel = logmel.compute(&sine, 0);
        let mean = |m: usize| mel.row(m).iter().sum::<f32>() / mel.frames as f32;
        let loudest = (0..80).max_by(|&a, &b| mean(a).total_cmp(&mean(b)));
        // 1 kHz is bin 25, where filter 26 peaks (checked against transformers).
        assert_eq!(loudest, Some(26));
    }

    #[test]
    fn window_pads_with_zeros() {
        let mel = MelFeatures {
            n_mels: 2,
            frames: 3,
            data: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        };
        assert_eq!(
            mel.window(1, 4),
            vec![2.0, 3.0, 0.0, 0.0, 5.0, 6.0, 0.0, 0.0]
        );
        assert_eq!(mel.window(5, 2), vec![0.0; 4]);
        assert!(mel.window(0, 0).is_empty());
    }
}
