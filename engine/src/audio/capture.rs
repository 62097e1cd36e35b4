//! Live audio in: a microphone through cpal, or a file played at real-time pace (a virtual
//! microphone for tests, demos and machines without one). Both deliver 16 kHz mono samples
//! to whoever polls them.
//!
//! The cpal callback runs on the audio thread and must not block or allocate: it only pushes
//! into a lock-free ring (rtrb). A small thread drains the ring into an unbounded channel, so
//! when transcription falls behind real time the audio waits in memory instead of being
//! dropped.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};

use super::{AudioError, SAMPLE_RATE, StreamResampler, load_file};

/// What a poll of an input found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputState {
    Open,
    /// The input has no more audio (a file played to its end, a device that went away).
    Ended,
}

/// Names of the audio input devices cpal sees.
pub fn input_devices() -> Result<Vec<String>, AudioError> {
    let host = cpal::default_host();
    let devices = host
        .input_devices()
        .map_err(|e| AudioError::Device(e.to_string()))?;
    Ok(devices.map(|d| device_name(&d)).collect())
}

fn device_name(d: &cpal::Device) -> String {
    d.description()
        .map(|desc| desc.name().to_owned())
        .unwrap_or_else(|_| "(unnamed device)".to_owned())
}

/// A source of live 16 kHz mono audio.
pub enum LiveInput {
    Microphone(Box<Microphone>),
    File(VirtualMicrophone),
}

impl LiveInput {
    /// Appends the samples that arrived since the last poll.
    pub fn poll(&mut self, out: &mut Vec<f32>) -> InputState {
        match self {
            Self::Microphone(m) => m.poll(out),
            Self::File(f) => f.poll(out),
        }
    }

    /// A name for the UI.
    pub fn name(&self) -> &str {
        match self {
            Self::Microphone(m) => &m.name,
            Self::File(f) => &f.name,
        }
    }
}

/// A file decoded up front and released at `pace` × real time.
pub struct VirtualMicrophone {
    samples: Vec<f32>,
    position: usize,
    started: Option<Instant>,
    pace: f64,
    name: String,
}

impl VirtualMicrophone {
    /// `pace` 1.0 plays in real time; 0 (or less) releases everything at once.
    pub fn open(path: &Path, pace: f64) -> Result<Self, AudioError> {
        Ok(Self::from_samples(
            load_file(path)?,
            pace,
            path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
        ))
    }

    pub fn from_samples(samples: Vec<f32>, pace: f64, name: String) -> Self {
        Self {
            samples,
            position: 0,
            started: None,
            pace,
            name,
        }
    }

    fn poll(&mut self, out: &mut Vec<f32>) -> InputState {
        let started = *self.started.get_or_insert_with(Instant::now);
        let due = if self.pace > 0.0 {
            let secs = started.elapsed().as_secs_f64() * self.pace;
            ((secs * f64::from(SAMPLE_RATE)) as usize).min(self.samples.len())
        } else {
            self.samples.len()
        };
        if due > self.position {
            out.extend_from_slice(&self.samples[self.position..due]);
            self.position = due;
        }
        if self.position >= self.samples.len() {
            InputState::Ended
        } else {
            InputState::Open
        }
    }
}

/// A cpal input stream; dropping it stops the capture.
pub struct Microphone {
    _stream: cpal::Stream,
    chunks: mpsc::Receiver<Vec<f32>>,
    resampler: StreamResampler,
    failed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    name: String,
}

/// Seconds of interleaved audio the realtime ring holds between two drains.
const RING_SECONDS: usize = 2;

impl Microphone {
    /// Opens the input device whose name contains `device` (case-insensitive), or the
    /// default one.
    pub fn open(device: Option<&str>) -> Result<Self, AudioError> {
        let host = cpal::default_host();
        let dev = match device {
            Some(wanted) => {
                let wanted_lc = wanted.to_lowercase();
                host.input_devices()
                    .map_err(|e| AudioError::Device(e.to_string()))?
                    .find(|d| device_name(d).to_lowercase().contains(&wanted_lc))
                    .ok_or_else(|| AudioError::Device(format!("no audio input named {wanted:?}")))?
            }
            None => host
                .default_input_device()
                .ok_or_else(|| AudioError::Device("there is no audio input device".into()))?,
        };
        let name = device_name(&dev);
        let config = dev
            .default_input_config()
            .map_err(|e| AudioError::Device(format!("{name}: {e}")))?;
        let channels = config.channels();
        let rate = config.sample_rate();
        let capacity = RING_SECONDS * rate as usize * usize::from(channels.max(1));
        let (producer, mut consumer) = rtrb::RingBuffer::<f32>::new(capacity.max(4096));
        let failed = Arc::new(AtomicBool::new(false));
        let stream = build_stream(&dev, &config, producer, failed.clone())
            .map_err(|e| AudioError::Device(format!("{name}: {e}")))?;
        stream
            .play()
            .map_err(|e| AudioError::Device(format!("{name}: {e}")))?;
        let (tx, chunks) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_drain = stop.clone();
        std::thread::Builder::new()
            .name("audio drain".into())
            .spawn(move || {
                while !stop_drain.load(Ordering::Relaxed) {
                    let n = consumer.slots();
                    if n > 0
                        && let Ok(chunk) = consumer.read_chunk(n)
                    {
                        let (a, b) = chunk.as_slices();
                        let mut v = Vec::with_capacity(n);
                        v.extend_from_slice(a);
                        v.extend_from_slice(b);
                        chunk.commit_all();
                        if tx.send(v).is_err() {
                            break;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
            .map_err(|e| AudioError::Device(e.to_string()))?;
        Ok(Self {
            _stream: stream,
            chunks,
            resampler: StreamResampler::new(rate, channels)?,
            failed,
            stop,
            name,
        })
    }

    fn poll(&mut self, out: &mut Vec<f32>) -> InputState {
        while let Ok(chunk) = self.chunks.try_recv() {
            out.extend(self.resampler.push(&chunk));
        }
        if self.failed.load(Ordering::Relaxed) {
            out.extend(self.resampler.flush());
            InputState::Ended
        } else {
            InputState::Open
        }
    }
}

impl Drop for Microphone {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn build_stream(
    dev: &cpal::Device,
    config: &cpal::SupportedStreamConfig,
    producer: rtrb::Producer<f32>,
    failed: Arc<AtomicBool>,
) -> Result<cpal::Stream, cpal::Error> {
    let stream_config: cpal::StreamConfig = config.config();
    match config.sample_format() {
        cpal::SampleFormat::I16 => typed_stream::<i16>(dev, stream_config, producer, failed),
        cpal::SampleFormat::I32 => typed_stream::<i32>(dev, stream_config, producer, failed),
        cpal::SampleFormat::U16 => typed_stream::<u16>(dev, stream_config, producer, failed),
        _ => typed_stream::<f32>(dev, stream_config, producer, failed),
    }
}

fn typed_stream<T>(
    dev: &cpal::Device,
    config: cpal::StreamConfig,
    mut producer: rtrb::Producer<f32>,
    failed: Arc<AtomicBool>,
) -> Result<cpal::Stream, cpal::Error>
where
    T: cpal::SizedSample,
    f32: cpal::FromSample<T>,
{
    let on_error = failed.clone();
    dev.build_input_stream::<T, _, _>(
        config,
        move |data: &[T], _| {
            // A full ring (the drain thread stalled) drops the newest samples rather than
            // blocking the audio thread.
            for &s in data {
                if producer
                    .push(<f32 as cpal::FromSample<T>>::from_sample_(s))
                    .is_err()
                {
                    break;
                }
            }
        },
        move |_| on_error.store(true, Ordering::Relaxed),
        None,
    )
}
