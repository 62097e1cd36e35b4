//! A transcript as plain text, SubRip (SRT), WebVTT or JSON.

use super::transcribe::{Segment, Transcript};

/// `HH:MM:SS<sep>mmm`.
fn clock(seconds: f64, sep: char) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    format!(
        "{:02}:{:02}:{:02}{sep}{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

pub fn to_txt(segments: &[Segment]) -> String {
    segments.iter().map(|s| format!("{}\n", s.text)).collect()
}

pub fn to_srt(segments: &[Segment]) -> String {
    segments
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "{}\n{} --> {}\n{}\n\n",
                i + 1,
                clock(s.start, ','),
                clock(s.end, ','),
                s.text
            )
        })
        .collect()
}

pub fn to_vtt(segments: &[Segment]) -> String {
    let mut out = String::from("WEBVTT\n\n");
    for s in segments {
        out.push_str(&format!(
            "{} --> {}\n{}\n\n",
            clock(s.start, '.'),
            clock(s.end, '.'),
            s.text
        ));
    }
    out
}

pub fn to_json(t: &Transcript) -> serde_json::Value {
    serde_json::json!({
        "text": t.text,
        "language": t.language,
        "audio_s": t.audio_s,
        "segments": t.segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(start: f64, end: f64, text: &str) -> Segment {
        Segment {
            start,
            end,
            text: text.into(),
            tokens: vec![],
            avg_logprob: 0.0,
            no_speech_prob: 0.0,
            temperature: 0.0,
        }
    }

    #[test]
    fn subtitle_formats() {
        let s = [seg(0.0, 1.5, "Hello."), seg(3661.02, 3662.999, "Bye.")];
        assert_eq!(
            to_srt(&s),
            "1\n00:00:00,000 --> 00:00:01,500\nHello.\n\n2\n01:01:01,020 --> 01:01:02,999\nBye.\n\n"
        );
        assert_eq!(
            to_vtt(&s),
            "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello.\n\n01:01:01.020 --> 01:01:02.999\nBye.\n\n"
        );
        assert_eq!(to_txt(&s), "Hello.\nBye.\n");
    }
}
