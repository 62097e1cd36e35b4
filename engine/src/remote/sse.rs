//! Server-sent events, decoded from the raw bytes of a streamed body. Written here because it
//! is a few lines over bytes we already hold (reqwest's byte stream), and the chunk boundaries
//! are where the bugs live: a chunk may end inside a line, or inside a multi-byte UTF-8
//! character, so bytes are buffered until a whole line has arrived and only then decoded.

/// Collects `data:` payloads, one per event.
#[derive(Default)]
pub struct SseDecoder {
    pending: Vec<u8>,
    data: Option<String>,
}

impl SseDecoder {
    /// Feeds the next chunk; each event it completes adds its data to `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<String>) -> Result<(), String> {
        self.pending.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(offset) = self.pending[start..].iter().position(|&b| b == b'\n') {
            let end = start + offset;
            let line = &self.pending[start..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let line = std::str::from_utf8(line)
                .map_err(|e| format!("an event line is not UTF-8 ({e})"))?
                .to_owned();
            self.line(&line, out);
            start = end + 1;
        }
        self.pending.drain(..start);
        Ok(())
    }

    /// The stream ended: an event without its closing blank line still counts.
    pub fn finish(&mut self, out: &mut Vec<String>) -> Result<(), String> {
        if !self.pending.is_empty() {
            self.push(b"\n", out)?;
        }
        out.extend(self.data.take());
        Ok(())
    }

    fn line(&mut self, line: &str, out: &mut Vec<String>) {
        if line.is_empty() {
            out.extend(self.data.take());
            return;
        }
        // Comments (keep-alives) start with ':'; fields other than data carry nothing we use.
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        if field != "data" {
            return;
        }
        let value = value.strip_prefix(' ').unwrap_or(value);
        match &mut self.data {
            Some(data) => {
                data.push('\n');
                data.push_str(value);
            }
            None => self.data = Some(value.to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(chunks: &[&[u8]]) -> Vec<String> {
        let mut d = SseDecoder::default();
        let mut out = Vec::new();
        for c in chunks {
            d.push(c, &mut out).expect("utf-8");
        }
        d.finish(&mut out).expect("utf-8");
        out
    }

    #[test]
    fn events_survive_any_split() {
        let body = "data: {\"a\":\"héllo → 世界 🎒\"}\r\n\r\n: keep-alive\n\nevent: x\ndata: one\ndata: two\n\ndata: [DONE]\n\n";
        let whole = decode(&[body.as_bytes()]);
        assert_eq!(whole, ["{\"a\":\"héllo → 世界 🎒\"}", "one\ntwo", "[DONE]"]);
        let bytes = body.as_bytes();
        // Every split point, including inside each multi-byte character.
        for cut in 0..bytes.len() {
            assert_eq!(
                decode(&[&bytes[..cut], &bytes[cut..]]),
                whole,
                "cut at {cut}"
            );
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(decode(&singles), whole);
    }

    #[test]
    fn an_unterminated_last_event_counts() {
        assert_eq!(decode(&[b"data: x"]), ["x"]);
        assert_eq!(decode(&[b"data:y\n"]), ["y"]);
    }

    #[test]
    fn invalid_utf8_is_an_error() {
        let mut d = SseDecoder::default();
        assert!(d.push(b"data: \xff\xfe\n\n", &mut Vec::new()).is_err());
    }
}
