//! Resampling to Whisper's 16 kHz with rubato's FFT resampler (a windowed-sinc anti-alias filter
//! applied in the frequency domain): whole buffers for files, a stream for the microphone.

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Indexing, Resampler, WindowFunction};

use super::{AudioError, SAMPLE_RATE};

/// Highest input rate accepted; above this a header is more likely wrong than the audio real.
const MAX_INPUT_RATE: u32 = 768_000;
/// Output frames per FFT block for files: long blocks give a sharp filter (cutoff ~7.9 kHz).
const FILE_BLOCK: usize = 1024;
/// Output frames per FFT block for the microphone: 32 ms of latency, cutoff ~7.8 kHz.
const STREAM_BLOCK: usize = 512;

/// Resamples mono `samples` at `rate` Hz to 16 kHz. The output has `round(len * 16000 / rate)`
/// samples and no delay: output sample `i` is the input at time `i / 16000` s.
pub fn resample_to_16k(samples: &[f32], rate: u32) -> Result<Vec<f32>, AudioError> {
    check_rate(rate)?;
    if rate == SAMPLE_RATE {
        return Ok(samples.to_vec());
    }
    if samples.is_empty() {
        return Ok(Vec::new());
    }
    let mut resampler = fft_resampler(rate, FILE_BLOCK, FixedSync::Both)?;
    let input = InterleavedSlice::new(samples, 1, samples.len()).map_err(resample_error)?;
    // `process_all` feeds the clip chunk by chunk, pads the tail with silence and drops the
    // filter's delay from the front.
    let output = resampler
        .process_all(&input, samples.len(), None)
        .map_err(resample_error)?;
    let mut data = output.take_data();
    // rubato rounds the length up; the contract is rounding to nearest.
    data.resize(output_len(samples.len() as u64, rate), 0.0);
    Ok(data)
}

/// Downmixes and resamples live interleaved audio to 16 kHz mono, chunk by chunk.
#[derive(Debug)]
pub struct StreamResampler {
    channels: usize,
    /// Samples of a frame split across two pushes.
    partial: Vec<f32>,
    /// `None` when the input is already 16 kHz: only the downmix is left to do.
    fft: Option<StreamFft>,
}

impl StreamResampler {
    pub fn new(input_rate: u32, channels: u16) -> Result<Self, AudioError> {
        check_rate(input_rate)?;
        if channels == 0 {
            return Err(AudioError::Resample("the input has no channels".into()));
        }
        let fft = if input_rate == SAMPLE_RATE {
            None
        } else {
            let resampler = fft_resampler(input_rate, STREAM_BLOCK, FixedSync::Input)?;
            Some(StreamFft {
                out: vec![0.0; resampler.output_frames_max()],
                to_trim: resampler.output_delay(),
                resampler,
                rate: input_rate,
                pending: Vec::new(),
                frames_in: 0,
                frames_out: 0,
            })
        };
        Ok(Self {
            channels: usize::from(channels),
            partial: Vec::new(),
            fft,
        })
    }

    /// Takes interleaved samples and returns the 16 kHz mono samples now ready. Input is held
    /// until a whole block has arrived.
    pub fn push(&mut self, interleaved: &[f32]) -> Vec<f32> {
        let mono = self.downmix(interleaved);
        match &mut self.fft {
            None => mono,
            Some(fft) => {
                fft.frames_in += mono.len() as u64;
                fft.pending.extend_from_slice(&mono);
                fft.run()
            }
        }
    }

    /// Returns the rest: held input and the filter's tail. Afterwards the total output is
    /// `round(input frames * 16000 / rate)` samples, and the resampler starts afresh.
    pub fn flush(&mut self) -> Vec<f32> {
        // A frame missing some of its channels cannot be mixed; drop it.
        self.partial.clear();
        match &mut self.fft {
            None => Vec::new(),
            Some(fft) => fft.finish(),
        }
    }

    fn downmix(&mut self, interleaved: &[f32]) -> Vec<f32> {
        let n = self.channels;
        if n == 1 {
            return interleaved.to_vec();
        }
        let mut mono = Vec::with_capacity((self.partial.len() + interleaved.len()) / n);
        let mut rest = interleaved;
        if !self.partial.is_empty() {
            let take = (n - self.partial.len()).min(rest.len());
            self.partial.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.partial.len() < n {
                return mono;
            }
            mono.push(mean(&self.partial));
            self.partial.clear();
        }
        let mut frames = rest.chunks_exact(n);
        mono.extend(frames.by_ref().map(mean));
        self.partial.extend_from_slice(frames.remainder());
        mono
    }
}

/// Sum, then divide: what numpy's `mean` does.
fn mean(frame: &[f32]) -> f32 {
    frame.iter().sum::<f32>() / frame.len() as f32
}

#[derive(Debug)]
struct StreamFft {
    resampler: Fft<f32>,
    rate: u32,
    /// Mono input not yet fed to the resampler.
    pending: Vec<f32>,
    /// Output scratch, `output_frames_max` long.
    out: Vec<f32>,
    /// Output frames still to drop: the filter's delay.
    to_trim: usize,
    frames_in: u64,
    frames_out: u64,
}

impl StreamFft {
    /// Feeds every whole block of `pending`.
    fn run(&mut self) -> Vec<f32> {
        let mut result = Vec::new();
        let mut used = 0;
        while self.pending.len() - used >= self.resampler.input_frames_next() {
            match self.process(used, None, &mut result) {
                Some(consumed) if consumed > 0 => used += consumed,
                _ => break,
            }
        }
        self.pending.drain(..used);
        self.frames_out += result.len() as u64;
        result
    }

    fn finish(&mut self) -> Vec<f32> {
        let target = output_len(self.frames_in, self.rate) as u64;
        let mut result = Vec::new();
        let left = self.pending.len();
        if left > 0 {
            // The block is completed with silence.
            self.process(0, Some(left), &mut result);
        }
        // More silence pushes the last of the audio out through the filter.
        let end = self.pending.len();
        while self.frames_out + (result.len() as u64) < target {
            let before = (result.len(), self.to_trim);
            self.process(end, Some(0), &mut result);
            if (result.len(), self.to_trim) == before {
                break;
            }
        }
        let keep = target.saturating_sub(self.frames_out);
        result.truncate(usize::try_from(keep).unwrap_or(usize::MAX));
        self.resampler.reset();
        self.pending.clear();
        self.to_trim = self.resampler.output_delay();
        self.frames_in = 0;
        self.frames_out = 0;
        result
    }

    /// Feeds one block from `pending[offset..]` (only its first `partial` frames when given, the
    /// rest silence) and appends the output, minus what is left of the delay. Returns the input
    /// frames consumed; `None` if rubato refuses the buffers, which their sizing rules out.
    fn process(
        &mut self,
        offset: usize,
        partial: Option<usize>,
        result: &mut Vec<f32>,
    ) -> Option<usize> {
        let input_slice = self.pending.get(offset..)?;
        let input = InterleavedSlice::new(input_slice, 1, input_slice.len()).ok()?;
        let out_frames = self.out.len();
        let mut output = InterleavedSlice::new_mut(self.out.as_mut_slice(), 1, out_frames).ok()?;
        let indexing = partial.map(|frames| Indexing::new().partial_len(frames));
        let (consumed, produced) = self
            .resampler
            .process_into_buffer(&input, &mut output, indexing.as_ref())
            .ok()?;
        let skip = self.to_trim.min(produced);
        self.to_trim -= skip;
        result.extend_from_slice(self.out.get(skip..produced)?);
        Some(consumed)
    }
}

fn check_rate(rate: u32) -> Result<(), AudioError> {
    if rate == 0 || rate > MAX_INPUT_RATE {
        return Err(AudioError::Resample(format!(
            "a sample rate of {rate} Hz is not supported"
        )));
    }
    Ok(())
}

/// `round(frames * 16000 / rate)`.
fn output_len(frames: u64, rate: u32) -> usize {
    let rate = u64::from(rate.max(1));
    let n = (frames * u64::from(SAMPLE_RATE) + rate / 2) / rate;
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// An FFT resampler from `rate` to 16 kHz whose blocks give about `block_out` output frames.
fn fft_resampler(rate: u32, block_out: usize, fixed: FixedSync) -> Result<Fft<f32>, AudioError> {
    let (rate_in, rate_out) = (rate as usize, SAMPLE_RATE as usize);
    let g = gcd(rate_in, rate_out);
    let (min_in, min_out) = (rate_in / g, rate_out / g);
    // Blocks are whole multiples of the smallest block. An even multiple makes both block sizes
    // even, which puts the filter's centre exactly `output_delay` frames in, so trimming that
    // many frames leaves no delay.
    let mut blocks = (block_out / min_out).max(1);
    blocks += blocks % 2;
    Fft::new_custom(
        rate_in,
        rate_out,
        blocks * min_in,
        1,
        1,
        WindowFunction::BlackmanHarris2,
        fixed,
    )
    .map_err(resample_error)
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn resample_error(e: impl std::fmt::Display) -> AudioError {
    AudioError::Resample(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sine(rate: u32, freq: f64, amp: f64, len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| {
                (amp * (2.0 * std::f64::consts::PI * freq * i as f64 / f64::from(rate)).sin())
                    as f32
            })
            .collect()
    }

    /// Largest difference from the ideal 16 kHz sine, away from the edges, where the filter
    /// (at most 1280 output frames long here) rings on the sine's abrupt start and end.
    fn max_error(out: &[f32], freq: f64, amp: f64) -> f64 {
        let ideal = sine(SAMPLE_RATE, freq, amp, out.len());
        let edge = 1400.min(out.len() / 4);
        out[edge..out.len() - edge]
            .iter()
            .zip(&ideal[edge..out.len() - edge])
            .map(|(a, b)| f64::from((a - b).abs()))
            .fold(0.0, f64::max)
    }

    #[test]
    fn sine_48k_keeps_frequency_amplitude_and_timing() {
        let input = sine(48_000, 1000.0, 0.5, 48_000 + 7);
        let out = resample_to_16k(&input, 48_000).expect("resample");
        assert_eq!(out.len(), 16_002);
        // Within 1% of the amplitude at every sample: a one-sample delay would be off by 0.19.
        assert!(
            max_error(&out, 1000.0, 0.5) < 0.005,
            "{}",
            max_error(&out, 1000.0, 0.5)
        );
    }

    #[test]
    fn sine_44k1_and_8k_resample_cleanly() {
        for rate in [44_100, 22_050, 8_000] {
            let input = sine(rate, 440.0, 0.8, rate as usize);
            let out = resample_to_16k(&input, rate).expect("resample");
            assert_eq!(out.len(), 16_000, "rate {rate}");
            assert!(max_error(&out, 440.0, 0.8) < 0.008, "rate {rate}");
        }
    }

    #[test]
    fn tiny_empty_and_invalid_inputs() {
        assert_eq!(resample_to_16k(&[0.25; 3], 48_000).expect("tiny").len(), 1);
        assert_eq!(resample_to_16k(&[0.25; 10], 44_100).expect("tiny").len(), 4);
        assert!(resample_to_16k(&[], 44_100).expect("empty").is_empty());
        assert_eq!(
            resample_to_16k(&[0.5, -0.5], 16_000).expect("same"),
            vec![0.5, -0.5]
        );
        assert!(matches!(
            resample_to_16k(&[0.1], 0),
            Err(AudioError::Resample(_))
        ));
        assert!(StreamResampler::new(0, 1).is_err());
        assert!(StreamResampler::new(48_000, 0).is_err());
    }

    #[test]
    fn stream_matches_whole_buffer() {
        let frames = 48_000 + 123;
        let mono = sine(48_000, 1000.0, 0.5, frames);
        // Stereo with the same signal in both channels: the downmix is the mono signal.
        let stereo: Vec<f32> = mono.iter().flat_map(|&s| [s, s]).collect();
        let mut stream = StreamResampler::new(48_000, 2).expect("stream");
        let mut out = Vec::new();
        // Odd-sized pushes split frames between calls.
        for piece in stereo.chunks(997) {
            out.extend(stream.push(piece));
        }
        out.extend(stream.flush());
        let whole = resample_to_16k(&mono, 48_000).expect("whole");
        assert_eq!(out.len(), whole.len());
        // Continuous: no gaps or repeats at block joins.
        assert!(
            max_error(&out, 1000.0, 0.5) < 0.005,
            "{}",
            max_error(&out, 1000.0, 0.5)
        );
        // Starts afresh after a flush.
        let again: Vec<f32> = stream
            .push(&stereo)
            .into_iter()
            .chain(stream.flush())
            .collect();
        assert_eq!(again, out);
    }

    #[test]
    fn stream_at_16k_only_downmixes() {
        let mut stream = StreamResampler::new(16_000, 2).expect("stream");
        assert_eq!(stream.push(&[1.0, 0.0, 0.5]), vec![0.5]);
        assert_eq!(stream.push(&[0.25, -1.0, -1.0]), vec![0.375, -1.0]);
        assert!(stream.flush().is_empty());
    }
}
