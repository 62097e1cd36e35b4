//! What the speech side keeps: its settings (in `state.json`) and each transcript (in
//! `transcripts.json`), and how a transcript is exported: TXT, SRT and VTT through the engine's
//! subtitle writers, JSON as text, language and timed segments.

use std::path::{Path, PathBuf};

use backpack_engine::models::whisper::{Segment, subtitles};
use serde::{Deserialize, Serialize};

/// How speech models are loaded and used (the Speech panel and chat dictation share them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpeechSettings {
    /// "f16" or "f32": storage of the Whisper weights.
    pub dtype: String,
    /// A language code; None detects it.
    pub language: Option<String>,
    /// Translate into English (multilingual models only).
    pub translate: bool,
    /// Input device: a part of its name; None is the system's default.
    pub device: Option<String>,
    pub last_model: Option<PathBuf>,
    /// Most recent first.
    pub recent_models: Vec<PathBuf>,
    pub selected_transcript: Option<u64>,
}

impl Default for SpeechSettings {
    fn default() -> Self {
        Self {
            dtype: "f16".into(),
            language: None,
            translate: false,
            device: None,
            last_model: None,
            recent_models: Vec::new(),
            selected_transcript: None,
        }
    }
}

impl SpeechSettings {
    pub fn remember_model(&mut self, path: &Path) {
        self.recent_models.retain(|p| p != path);
        self.recent_models.insert(0, path.to_owned());
        self.recent_models.truncate(10);
        self.last_model = Some(path.to_owned());
    }
}

/// Where a transcript's audio came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    #[default]
    Recording,
    File,
}

/// One timed piece of text; times in seconds from the start of the audio.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub start: f64,
    pub end: f64,
    pub text: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    pub id: u64,
    pub title: String,
    #[serde(default)]
    pub origin: Origin,
    /// The audio file transcribed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// The Whisper model that wrote it.
    #[serde(default)]
    pub model: Option<PathBuf>,
    /// The language heard (a code), once known.
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub segments: Vec<Line>,
    /// Seconds of audio heard, once finished.
    #[serde(default)]
    pub audio_s: f64,
    /// Seconds since the Unix epoch.
    #[serde(default)]
    pub created: u64,
    /// Stopped before the end of the audio.
    #[serde(default)]
    pub stopped: bool,
    /// What cut it short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TranscriptFormat {
    Txt,
    Srt,
    Vtt,
    Json,
}

impl TranscriptFormat {
    pub const ALL: [TranscriptFormat; 4] = [Self::Txt, Self::Srt, Self::Vtt, Self::Json];

    pub fn extension(self) -> &'static str {
        match self {
            Self::Txt => "txt",
            Self::Srt => "srt",
            Self::Vtt => "vtt",
            Self::Json => "json",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Txt => "Plain text",
            Self::Srt => "SubRip subtitles",
            Self::Vtt => "WebVTT subtitles",
            Self::Json => "JSON",
        }
    }
}

impl Transcript {
    pub fn new(id: u64, title: String, origin: Origin) -> Self {
        Self {
            id,
            title,
            origin,
            file: None,
            model: None,
            language: None,
            segments: Vec::new(),
            audio_s: 0.0,
            created: crate::gui::store::now_secs(),
            stopped: false,
            error: None,
        }
    }

    /// All the text, one space between segments.
    pub fn text(&self) -> String {
        let parts: Vec<&str> = self
            .segments
            .iter()
            .map(|s| s.text.trim())
            .filter(|t| !t.is_empty())
            .collect();
        parts.join(" ")
    }

    /// Case-insensitive match on the title or the text.
    pub fn matches(&self, query: &str) -> bool {
        let q = query.trim().to_lowercase();
        q.is_empty()
            || self.title.to_lowercase().contains(&q)
            || self
                .segments
                .iter()
                .any(|s| s.text.to_lowercase().contains(&q))
    }

    /// The engine's segments, for its subtitle writers.
    fn engine_segments(&self) -> Vec<Segment> {
        self.segments
            .iter()
            .map(|l| Segment {
                start: l.start,
                end: l.end,
                text: l.text.trim().to_owned(),
                tokens: Vec::new(),
                avg_logprob: 0.0,
                no_speech_prob: 0.0,
                temperature: 0.0,
            })
            .collect()
    }

    pub fn export(&self, format: TranscriptFormat) -> String {
        let segments = self.engine_segments();
        match format {
            TranscriptFormat::Txt => subtitles::to_txt(&segments),
            TranscriptFormat::Srt => subtitles::to_srt(&segments),
            TranscriptFormat::Vtt => subtitles::to_vtt(&segments),
            TranscriptFormat::Json => {
                let segments: Vec<_> = segments
                    .iter()
                    .map(|s| serde_json::json!({"start": s.start, "end": s.end, "text": s.text}))
                    .collect();
                let json = serde_json::json!({
                    "text": self.text(),
                    "language": self.language,
                    "segments": segments,
                });
                let mut out = serde_json::to_string_pretty(&json).unwrap_or_default();
                out.push('\n');
                out
            }
        }
    }
}

/// `mm:ss.s`, or `h:mm:ss.s` from an hour on.
pub fn clock(seconds: f64) -> String {
    let tenths = (seconds.max(0.0) * 10.0).round() as u64;
    let (h, m, s, t) = (
        tenths / 36_000,
        tenths / 600 % 60,
        tenths / 10 % 60,
        tenths % 10,
    );
    if h > 0 {
        format!("{h}:{m:02}:{s:02}.{t}")
    } else {
        format!("{m:02}:{s:02}.{t}")
    }
}

/// `YYYY-MM-DD HH:MM` in UTC (the app has no time zone database).
pub fn date_time(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rest = unix_secs % 86_400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        rest / 3600,
        rest / 60 % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Transcript {
        let mut t = Transcript::new(1, "Meeting".into(), Origin::File);
        t.language = Some("en".into());
        t.segments = vec![
            Line {
                start: 0.0,
                end: 1.5,
                text: " Hello there.".into(),
            },
            Line {
                start: 1.5,
                end: 3.25,
                text: "General Kenobi.".into(),
            },
        ];
        t
    }

    #[test]
    fn exports_every_format() {
        let t = sample();
        assert_eq!(
            t.export(TranscriptFormat::Txt),
            "Hello there.\nGeneral Kenobi.\n"
        );
        let srt = t.export(TranscriptFormat::Srt);
        assert!(srt.starts_with("1\n00:00:00,000 --> 00:00:01,500\nHello there.\n"));
        assert!(t.export(TranscriptFormat::Vtt).starts_with("WEBVTT\n\n"));
        let json: serde_json::Value =
            serde_json::from_str(&t.export(TranscriptFormat::Json)).expect("json");
        assert_eq!(json["text"], "Hello there. General Kenobi.");
        assert_eq!(json["language"], "en");
        assert_eq!(json["segments"][1]["end"], 3.25);
    }

    #[test]
    fn search_clock_and_dates() {
        let t = sample();
        assert!(t.matches("kenobi") && t.matches("MEET") && !t.matches("sith"));
        assert_eq!(clock(0.0), "00:00.0");
        assert_eq!(clock(83.46), "01:23.5");
        assert_eq!(clock(3725.0), "1:02:05.0");
        assert_eq!(date_time(0), "1970-01-01 00:00");
        assert_eq!(date_time(1_709_210_096), "2024-02-29 12:34");
    }
}
