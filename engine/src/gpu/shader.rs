//! A tiny preprocessor so one WGSL file can serve every specialisation of a kernel family:
//! `#if NAME` / `#else` / `#endif` (a define counts as set unless its value is "0"),
//! `#for I in 0..COUNT` / `#endfor` (the lines between repeated with `{{I}}` replaced by 0, 1,
//! …; COUNT a number or a define), and `{{NAME}}` replaced by the define's value (workgroup
//! sizes, array lengths). `#for` writes unrolled code out: GPU compilers keep named values in
//! registers, while a dynamically indexed private array may end up in slow local memory.

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
    let lines: Vec<&str> = out.lines().collect();
    let mut out = String::with_capacity(out.len());
    unroll(&lines, defines, &mut out)?;
    for (k, v) in defines {
        out = out.replace(&format!("{{{{{k}}}}}"), v);
    }
    if let Some(pos) = out.find("{{") {
        let end = out[pos..].find("}}").map_or(out.len(), |e| pos + e + 2);
        return Err(format!("undefined placeholder {}", &out[pos..end]));
    }
    Ok(out)
}

/// Expands `#for` blocks (nested ones included) into `out`.
fn unroll(lines: &[&str], defines: &[(&str, String)], out: &mut String) -> Result<(), String> {
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let Some(rest) = trimmed.strip_prefix("#for ") else {
            if trimmed.starts_with("#endfor") {
                return Err("#endfor without #for".to_owned());
            }
            out.push_str(lines[i]);
            out.push('\n');
            i += 1;
            continue;
        };
        let (var, count) = parse_for(rest, defines)?;
        let mut depth = 1;
        let mut end = i + 1;
        while end < lines.len() {
            let t = lines[end].trim_start();
            if t.starts_with("#for ") {
                depth += 1;
            } else if t.starts_with("#endfor") {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            end += 1;
        }
        if depth != 0 {
            return Err(format!("unterminated #for {var}"));
        }
        let placeholder = format!("{{{{{var}}}}}");
        for index in 0..count {
            let body: Vec<String> = lines[i + 1..end]
                .iter()
                .map(|l| l.replace(&placeholder, &index.to_string()))
                .collect();
            let body: Vec<&str> = body.iter().map(String::as_str).collect();
            unroll(&body, defines, out)?;
        }
        i = end + 1;
    }
    Ok(())
}

/// `I in 0..COUNT` → (I, COUNT), COUNT a number or a define's value.
fn parse_for(rest: &str, defines: &[(&str, String)]) -> Result<(String, u32), String> {
    let malformed = || format!("malformed #for {rest}");
    let (var, range) = rest.split_once(" in ").ok_or_else(malformed)?;
    let count = range
        .trim()
        .strip_prefix("0..")
        .ok_or_else(malformed)?
        .trim();
    let value = defines
        .iter()
        .find(|(k, _)| *k == count)
        .map_or(count, |(_, v)| v.as_str());
    let count = value.parse().map_err(|_| malformed())?;
    Ok((var.trim().to_owned(), count))
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
        let src = "#for i in 0..2\n#for j in 0..N\nv{{i}}{{j}}\n#endfor\n#endfor\n";
        let out = preprocess(src, &[("N", "3".into())]).expect("valid");
        assert_eq!(out, "v00\nv01\nv02\nv10\nv11\nv12\n");
        assert!(preprocess("#for i in 0..2\n", &[]).is_err());
        assert!(preprocess("#for i in 0..M\n#endfor\n", &[]).is_err());
        assert!(preprocess("{{M}}", &[]).is_err());
    }
}
