//! Decoding an audio file to mono f32 samples at its own sample rate.

use std::fs::File;
use std::io::ErrorKind;
use std::path::Path;

use symphonia::core::audio::GenericAudioBufferRef;
use symphonia::core::codecs::CodecParameters;
use symphonia::core::codecs::audio::{AudioDecoder, AudioDecoderOptions};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;

use super::{AudioError, SAMPLE_RATE, resample_to_16k};

/// Longest audio decoded, in seconds (12 hours). Bounds memory: 12 hours of 48 kHz mono f32 is
/// about 8 GB.
pub const MAX_SECONDS: u64 = 12 * 3600;

/// A decoded file, downmixed to mono at the file's own sample rate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodedAudio {
    /// Mono samples: the average of the file's channels.
    pub samples: Vec<f32>,
    pub sample_rate: u32,
    /// How many channels the file had before the downmix.
    pub channels: u16,
}

/// Decodes the first audio track of `path` (any container and codec symphonia is built with) to
/// mono f32. 16-bit PCM comes out as `i16 / 32768`, as numpy/soundfile read it. Packets that fail
/// to decode are skipped; a file cut short returns what decoded before the cut. An empty file
/// gives no samples.
pub fn decode_file(path: &Path) -> Result<DecodedAudio, AudioError> {
    // The demuxers and decoders read untrusted headers; a panic inside one (an arithmetic
    // overflow on a hostile field) is a damaged file, not a crash.
    std::panic::catch_unwind(|| decode_unguarded(path)).unwrap_or_else(|panic| {
        let detail = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        Err(AudioError::Corrupt {
            path: path.to_owned(),
            detail: format!("the decoder failed on it: {detail}"),
        })
    })
}

fn decode_unguarded(path: &Path) -> Result<DecodedAudio, AudioError> {
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let len = file.metadata().map_err(|e| io_error(path, e))?.len();
    if len == 0 {
        return Ok(DecodedAudio {
            samples: Vec::new(),
            sample_rate: SAMPLE_RATE,
            channels: 1,
        });
    }
    let mss = MediaSourceStream::new(Box::new(file), MediaSourceStreamOptions::default());
    let mut hint = Hint::new();
    if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
        hint.with_extension(ext);
    }
    let format = symphonia::default::get_probe()
        .probe(
            &hint,
            mss,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| probe_error(path, e))?;
    decode_track(path, format)
}

/// [`decode_file`], then resampled to Whisper's 16 kHz (no-op when the file already is).
pub fn load_file(path: &Path) -> Result<Vec<f32>, AudioError> {
    let audio = decode_file(path)?;
    resample_to_16k(&audio.samples, audio.sample_rate)
}

/// The track decoded and what its header says about it.
struct Track {
    id: u32,
    decoder: Box<dyn AudioDecoder>,
    sample_rate: Option<u32>,
    channels: Option<usize>,
}

/// Picks the first audio track with a known codec and makes its decoder.
fn open_track(path: &Path, format: &dyn FormatReader) -> Result<Track, AudioError> {
    let Some(track) = format.first_track_known_codec(TrackType::Audio) else {
        return Err(match format.first_track(TrackType::Audio) {
            Some(_) => unsupported(path, "its audio codec is not one Backpack decodes"),
            None => AudioError::NoTrack {
                path: path.to_owned(),
            },
        });
    };
    let Some(CodecParameters::Audio(params)) = &track.codec_params else {
        return Err(AudioError::NoTrack {
            path: path.to_owned(),
        });
    };
    let decoder = symphonia::default::get_codecs()
        .make_audio_decoder(params, &AudioDecoderOptions::default())
        .map_err(|e| match e {
            SymphoniaError::Unsupported(_) => {
                unsupported(path, "its audio codec is not one Backpack decodes")
            }
            other => corrupt(path, &other),
        })?;
    Ok(Track {
        id: track.id,
        decoder,
        sample_rate: params.sample_rate,
        channels: params.channels.as_ref().map(|c| c.count()),
    })
}

/// Decodes every packet of the chosen track, downmixing as it goes.
fn decode_track(
    path: &Path,
    mut format: Box<dyn FormatReader>,
) -> Result<DecodedAudio, AudioError> {
    let mut track = open_track(path, &*format)?;
    let mut mixer = Mixer::default();
    let mut failed = 0u64;
    loop {
        let packet = match format.next_packet() {
            Ok(Some(packet)) => packet,
            Ok(None) => break,
            // Streams without an end marker, and files cut short, end this way.
            Err(SymphoniaError::IoError(e)) if e.kind() == ErrorKind::UnexpectedEof => break,
            Err(SymphoniaError::IoError(e)) => return Err(io_error(path, e)),
            // A new (chained) stream starts: its tracks and codec may differ.
            Err(SymphoniaError::ResetRequired) => {
                track = open_track(path, &*format)?;
                continue;
            }
            Err(SymphoniaError::Unsupported(what)) => return Err(unsupported(path, what)),
            // The container is damaged from here on: keep what came before it.
            Err(e) if mixer.samples.is_empty() => return Err(corrupt(path, &e)),
            Err(_) => break,
        };
        if packet.track_id != track.id {
            continue;
        }
        // The decoded buffer borrows the decoder: finish with it before any reset below.
        let failure = match track.decoder.decode(&packet) {
            Ok(buf) => mixer.push(path, &buf).map(|()| None),
            Err(e) => Ok(Some(e)),
        }?;
        match failure {
            None => {}
            // One bad packet: skip it, as symphonia's own player does.
            Some(SymphoniaError::DecodeError(_) | SymphoniaError::IoError(_)) => failed += 1,
            Some(SymphoniaError::ResetRequired) => {
                failed += 1;
                track = open_track(path, &*format)?;
            }
            Some(SymphoniaError::Unsupported(what)) => return Err(unsupported(path, what)),
            Some(e) => return Err(corrupt(path, &e)),
        }
    }
    if mixer.samples.is_empty() && failed > 0 {
        return Err(AudioError::Corrupt {
            path: path.to_owned(),
            detail: format!("none of its {failed} audio packets could be decoded"),
        });
    }
    let sample_rate = mixer.rate.or(track.sample_rate).unwrap_or(SAMPLE_RATE);
    if sample_rate == 0 {
        return Err(AudioError::Corrupt {
            path: path.to_owned(),
            detail: "its header gives a sample rate of 0 Hz".into(),
        });
    }
    let channels = match mixer.channels {
        0 => track.channels.unwrap_or(1),
        n => n,
    };
    Ok(DecodedAudio {
        samples: mixer.samples,
        sample_rate,
        channels: u16::try_from(channels).unwrap_or(u16::MAX),
    })
}

/// Collects decoded buffers as one mono signal.
#[derive(Default)]
struct Mixer {
    samples: Vec<f32>,
    /// The rate of the first non-empty buffer.
    rate: Option<u32>,
    /// The most channels seen in a buffer.
    channels: usize,
    /// Scratch: the current buffer converted to f32, one plane per channel.
    planes: Vec<Vec<f32>>,
}

impl Mixer {
    /// Appends `buf` averaged over its channels.
    fn push(&mut self, path: &Path, buf: &GenericAudioBufferRef<'_>) -> Result<(), AudioError> {
        if buf.frames() == 0 {
            return Ok(());
        }
        let rate = buf.spec().rate();
        if *self.rate.get_or_insert(rate) != rate {
            return Err(unsupported(path, "its sample rate changes partway through"));
        }
        self.channels = self.channels.max(buf.num_planes());
        // symphonia converts i16 as `v / 32768`, and the other integer formats alike.
        buf.copy_to_vecs_planar::<f32>(&mut self.planes);
        let Some((first, rest)) = self.planes.split_first() else {
            return Ok(());
        };
        let start = self.samples.len();
        self.samples.extend_from_slice(first);
        if !rest.is_empty() {
            let mixed = &mut self.samples[start..];
            for plane in rest {
                for (o, s) in mixed.iter_mut().zip(plane) {
                    *o += s;
                }
            }
            // Sum, then divide: what numpy's `mean(axis=1)` does.
            let n = self.planes.len() as f32;
            for o in mixed {
                *o /= n;
            }
        }
        if self.samples.len() as u64 > MAX_SECONDS * u64::from(rate) {
            return Err(AudioError::TooLong {
                path: path.to_owned(),
                hours: MAX_SECONDS / 3600,
            });
        }
        Ok(())
    }
}

fn io_error(path: &Path, source: std::io::Error) -> AudioError {
    AudioError::Io {
        path: path.to_owned(),
        source,
    }
}

fn unsupported(path: &Path, detail: &str) -> AudioError {
    AudioError::Unsupported {
        path: path.to_owned(),
        detail: detail.to_owned(),
    }
}

fn corrupt(path: &Path, e: &SymphoniaError) -> AudioError {
    AudioError::Corrupt {
        path: path.to_owned(),
        detail: e.to_string(),
    }
}

fn probe_error(path: &Path, e: SymphoniaError) -> AudioError {
    match e {
        SymphoniaError::IoError(e) if e.kind() != ErrorKind::UnexpectedEof => io_error(path, e),
        // Ran out of bytes before anything was recognised.
        SymphoniaError::IoError(_) => unsupported(path, "no audio stream was found in it"),
        SymphoniaError::Unsupported(what) if what.starts_with("core (probe)") => {
            unsupported(path, "no audio stream was found in it")
        }
        SymphoniaError::Unsupported(what) => unsupported(path, what),
        other => corrupt(path, &other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A canonical 44-byte-header WAV. `format` 1 = PCM, 3 = IEEE float. `claimed` overrides the
    /// data length written in the header (for truncated files).
    fn wav(
        format: u16,
        channels: u16,
        rate: u32,
        bits: u16,
        data: &[u8],
        claimed: Option<u32>,
    ) -> Vec<u8> {
        let data_len = claimed.unwrap_or(data.len() as u32);
        let block = channels * bits / 8;
        let mut out = Vec::new();
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&(36 + data_len).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&format.to_le_bytes());
        out.extend_from_slice(&channels.to_le_bytes());
        out.extend_from_slice(&rate.to_le_bytes());
        out.extend_from_slice(&(rate * u32::from(block)).to_le_bytes());
        out.extend_from_slice(&block.to_le_bytes());
        out.extend_from_slice(&bits.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&data_len.to_le_bytes());
        out.extend_from_slice(data);
        out
    }

    fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("backpack-audio-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).expect("write test file");
        path
    }

    /// Interleaved stereo i16 frames: left counts up, right down, covering the whole range.
    fn stereo_i16(frames: usize) -> Vec<i16> {
        (0..frames)
            .flat_map(|i| {
                let l = (i as i32 * 37 % 65536 - 32768) as i16;
                let r = (32767 - i as i32 * 53 % 65536) as i16;
                [l, r]
            })
            .collect()
    }

    #[test]
    fn pcm16_stereo_is_exact_and_averaged() {
        let pcm = stereo_i16(3000);
        let bytes: Vec<u8> = pcm.iter().flat_map(|s| s.to_le_bytes()).collect();
        let path = temp_file("s16.wav", &wav(1, 2, 8000, 16, &bytes, None));
        let audio = decode_file(&path).expect("decode");
        let _ = std::fs::remove_file(&path);
        assert_eq!(audio.sample_rate, 8000);
        assert_eq!(audio.channels, 2);
        assert_eq!(audio.samples.len(), 3000);
        for (i, frame) in pcm.chunks_exact(2).enumerate() {
            let l = f32::from(frame[0]) / 32768.0;
            let r = f32::from(frame[1]) / 32768.0;
            assert_eq!(audio.samples[i], (l + r) / 2.0, "frame {i}");
        }
    }

    #[test]
    fn float32_mono_is_exact() {
        let samples: Vec<f32> = (0..2500)
            .map(|i| ((i as f32) * 0.013).sin() * 0.9)
            .collect();
        let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        let path = temp_file("f32.wav", &wav(3, 1, 44_100, 32, &bytes, None));
        let audio = decode_file(&path).expect("decode");
        let _ = std::fs::remove_file(&path);
        assert_eq!(audio.sample_rate, 44_100);
        assert_eq!(audio.channels, 1);
        assert_eq!(audio.samples, samples);
    }

    #[test]
    fn truncated_wav_returns_what_is_there() {
        let pcm = stereo_i16(5000);
        let bytes: Vec<u8> = pcm.iter().flat_map(|s| s.to_le_bytes()).collect();
        // The header claims twice the data; the file also ends mid-frame.
        let mut file = wav(1, 2, 8000, 16, &bytes, Some(2 * bytes.len() as u32));
        file.truncate(file.len() - 3);
        let path = temp_file("cut.wav", &file);
        let audio = decode_file(&path).expect("decode");
        let _ = std::fs::remove_file(&path);
        assert!(audio.samples.len() >= 4000, "got {}", audio.samples.len());
        assert!(audio.samples.len() < 5000);
        for (i, frame) in pcm.chunks_exact(2).take(audio.samples.len()).enumerate() {
            let mean = (f32::from(frame[0]) / 32768.0 + f32::from(frame[1]) / 32768.0) / 2.0;
            assert_eq!(audio.samples[i], mean, "frame {i}");
        }
    }

    #[test]
    fn garbage_is_unsupported() {
        let text = "this is plain text and no sound at all\n".repeat(200);
        let path = temp_file("garbage.wav", text.as_bytes());
        let result = decode_file(&path);
        let _ = std::fs::remove_file(&path);
        assert!(
            matches!(result, Err(AudioError::Unsupported { .. })),
            "{result:?}"
        );
    }

    #[test]
    fn empty_file_gives_no_samples() {
        let path = temp_file("empty.wav", &[]);
        let result = decode_file(&path);
        let _ = std::fs::remove_file(&path);
        assert!(result.expect("empty decodes").samples.is_empty());
    }

    #[test]
    fn missing_file_is_an_io_error() {
        let path = std::env::temp_dir().join("backpack-audio-no-such-file.wav");
        assert!(matches!(decode_file(&path), Err(AudioError::Io { .. })));
    }

    #[test]
    fn load_file_resamples_to_16k() {
        let samples: Vec<f32> = (0..8000).map(|i| (i as f32 * 0.05).sin() * 0.5).collect();
        let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        let path = temp_file("8k.wav", &wav(3, 1, 8000, 32, &bytes, None));
        let out = load_file(&path).expect("load");
        let _ = std::fs::remove_file(&path);
        assert_eq!(out.len(), 16_000);
    }
}
