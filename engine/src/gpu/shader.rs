//! A tiny preprocessor so one WGSL file can serve every specialisation of a kernel family:
//! `#if NAME` / `#else` / `#endif` (a define counts as set unless its value is "0"), and
//! `{{NAME}}` replaced by the define's value (workgroup sizes, array lengths).

/// Expands `source` for the given defines. Unbalanced directives are programming errors in
/// the shipped shaders and are reported as such.
pub fn preprocess(source: &str, defines: &[(&str, String)]) -> Result<String, String> {
    let is_set = |name: &str| defines.iter().any(|(k, v)| *k == name && v.as_str() != "0");
    let mut out = String::with_capacity(source.len());
    // Each entry: (this branch active, any enclosing branch inactive).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |stack: &Vec<(bool, bool)>| stack.iter().all(|(a, _)| *a);
    for (lineno, line) in source.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("#if ") {
            let name = rest.trim();
            let (negate, name) = match name.strip_prefix('!') {
                Some(n) => (true, n.trim()),
                None => (false, name),
            };
            stack.push((is_set(name) != negate, false));
        } else if trimmed.starts_with("#else") {
            let top = stack
                .last_mut()
                .ok_or_else(|| format!("line {}: #else without #if", lineno + 1))?;
            top.0 = !top.0;
        } else if trimmed.starts_with("#endif") {
            stack
                .pop()
                .ok_or_else(|| format!("line {}: #endif without #if", lineno + 1))?;
        } else if active(&stack) {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err("unterminated #if".to_owned());
    }
    for (k, v) in defines {
        out = out.replace(&format!("{{{{{k}}}}}"), v);
    }
    if let Some(pos) = out.find("{{") {
        let end = out[pos..].find("}}").map_or(out.len(), |e| pos + e + 2);
        return Err(format!("undefined placeholder {}", &out[pos..end]));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::preprocess;

    #[test]
    fn branches_nest_and_placeholders_expand() {
        let src = "a\n#if X\nb{{N}}\n#if !Y\nc\n#else\nd\n#endif\n#else\ne\n#endif\nf\n";
        let out = preprocess(src, &[("X", "1".into()), ("N", "7".into())]).expect("valid");
        assert_eq!(out, "a\nb7\nc\nf\n");
        let out = preprocess(src, &[("X", "0".into()), ("N", "7".into())]).expect("valid");
        assert_eq!(out, "a\ne\nf\n");
        assert!(preprocess("#if A\n", &[]).is_err());
        assert!(preprocess("{{M}}", &[]).is_err());
    }
}
