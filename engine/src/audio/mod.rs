//! Audio in: files decoded with symphonia, downmixed and resampled to Whisper's 16 kHz mono
//! (rubato), and the log-mel spectrogram Whisper's encoder reads (realfft).

mod capture;
mod decode;
mod mel;
mod resample;

use std::path::PathBuf;

pub use capture::{InputState, LiveInput, Microphone, VirtualMicrophone, input_devices};
pub use decode::{DecodedAudio, MAX_SECONDS, decode_file, load_file};
pub use mel::{HOP_LENGTH, LogMel, MelFeatures, N_FFT};
pub use resample::{StreamResampler, resample_to_16k};

/// The sample rate Whisper hears, in Hz.
pub const SAMPLE_RATE: u32 = 16_000;

#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is not an audio format Backpack reads (WAV, FLAC, MP3, Ogg/Vorbis, M4A/AAC): {detail}"
    )]
    Unsupported { path: PathBuf, detail: String },
    #[error("{path}: the audio is damaged and could not be decoded ({detail})")]
    Corrupt { path: PathBuf, detail: String },
    #[error("{path} holds no audio track")]
    NoTrack { path: PathBuf },
    #[error("{path} is longer than {hours} hours; split it into shorter files")]
    TooLong { path: PathBuf, hours: u64 },
    #[error("audio input: {0}")]
    Device(String),
    #[error("resampling the audio to 16 kHz failed: {0}")]
    Resample(String),
}
