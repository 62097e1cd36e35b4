//! JSON written as Python's `json.dumps` writes it, which is what chat templates' `tojson`
//! produces under transformers: `", "` and `": "` between items (or `","` with an indent),
//! non-ASCII kept as it is, and keys in the order they came. Models were trained on tool
//! lists rendered this way, so the prompt must match byte for byte.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde_json::Value as Json;

/// `tojson(indent=None, separators=None, sort_keys=False, ensure_ascii=False)`.
pub fn tojson_filter(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent.or(kwargs.get::<Option<Value>>("indent")?) {
        Some(v) if v.is_none() => None,
        Some(v) => Some(
            usize::try_from(v)
                .map_err(|_| Error::new(ErrorKind::InvalidOperation, "tojson: bad indent"))?,
        ),
        None => None,
    };
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators takes two strings",
            ));
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let style = Style {
        indent,
        item,
        key,
        sort_keys,
        ensure_ascii,
    };
    let mut out = String::new();
    style.write(&mut out, &json, 0);
    Ok(Value::from_safe_string(out))
}

struct Style {
    indent: Option<usize>,
    item: String,
    key: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl Style {
    fn write(&self, out: &mut String, v: &Json, depth: usize) {
        match v {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(&python_number(n)),
            Json::String(s) => self.string(out, s),
            Json::Array(items) => {
                if items.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(out, depth + 1);
                    self.write(out, item, depth + 1);
                }
                self.newline(out, depth);
                out.push(']');
            }
            Json::Object(map) => {
                if map.is_empty() {
                    out.push_str("{}");
                    return;
                }
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(out, depth + 1);
                    self.string(out, k);
                    out.push_str(&self.key);
                    self.write(out, item, depth + 1);
                }
                self.newline(out, depth);
                out.push('}');
            }
        }
    }

    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && (c as u32) > 0x7e) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python writes whole floats with a trailing `.0` and large or small ones in exponent form
/// (`1e+20`); serde keeps integers as integers, which is what Python does for ints too.
fn python_number(n: &serde_json::Number) -> String {
    if n.is_i64() || n.is_u64() {
        return n.to_string();
    }
    let f = n.as_f64().unwrap_or(0.0);
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN".into()
        } else if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        // Python's repr: shortest digits, exponent with a sign and at least two digits.
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        return format!(
            "{mantissa}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        );
    }
    let s = f.to_string();
    if s.contains('.') { s } else { format!("{s}.0") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(source: &str, ctx: Json) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson_filter);
        env.render_str(source, ctx).expect("renders")
    }

    #[test]
    fn matches_python_json_dumps() {
        let v =
            serde_json::json!({"z": 1, "a": [1.0, 2.5, "é<>&", null, true], "e": {}, "f": 1e20});
        // json.dumps(v, ensure_ascii=False)
        assert_eq!(
            dumps("{{ v | tojson }}", serde_json::json!({"v": v})),
            r#"{"z": 1, "a": [1.0, 2.5, "é<>&", null, true], "e": {}, "f": 1e+20}"#
        );
        // json.dumps(v, indent=2)
        assert_eq!(
            dumps(
                "{{ v | tojson(indent=2) }}",
                serde_json::json!({"v": {"b": [1, {"c": "d"}]}})
            ),
            "{\n  \"b\": [\n    1,\n    {\n      \"c\": \"d\"\n    }\n  ]\n}"
        );
        assert_eq!(
            dumps(
                "{{ v | tojson(separators=(',', ':'), sort_keys=true) }}",
                serde_json::json!({"v": {"b": 1, "a": "\u{1}"}})
            ),
            r#"{"a":"\u0001","b":1}"#
        );
    }
}
