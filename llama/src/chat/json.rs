//! The `tojson` filter of chat templates, written the way Hugging Face's `apply_chat_template`
//! defines it: Python's `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`, so `{"a": 1, "b": [1, 2]}` with a space after `:` and `,` and no HTML
//! escaping (minijinja's own `tojson` is compact and escapes `<`, `>`, `&` and `'`).
//!
//! Keyword arguments: `indent` (int), `ensure_ascii` (bool), `sort_keys` (bool) and
//! `separators` (a pair of strings), as in Python.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

use super::limits::MAX_RENDERED_BYTES;

/// How to write: Python's `json.dumps` options.
struct Style {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// The `tojson` filter.
pub(crate) fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => {
                super::limits::check_width("tojson indent", s.chars().count())?;
                s.to_string()
            }
            None => {
                let width = usize::try_from(v.as_i64().unwrap_or(-1)).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be a non-negative integer or a string",
                    )
                })?;
                super::limits::check_width("tojson indent", width)?;
                " ".repeat(width)
            }
        }),
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => (item, key),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings",
                ))
            }
        },
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = Style {
        indent,
        item_sep,
        key_sep,
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, &value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn write_value(out: &mut String, v: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v),
        ValueKind::String => write_string(out, v.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in v.try_iter()? {
                let value = v.get_item(&key)?;
                entries.push((key_text(&key)?, value));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, ('{', '}'), entries.len(), style, depth, |out, i| {
                let (key, value) = &entries[i];
                write_string(out, key, style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_value(out, value, style, depth + 1)
            })?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, ('[', ']'), items.len(), style, depth, |out, i| {
                write_value(out, &items[i], style, depth + 1)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a value of kind {}", v.kind()),
            ))
        }
    }
    Ok(())
}

/// Writes `n` items between `brackets`, separated and indented as Python does.
fn write_container(
    out: &mut String,
    brackets: (char, char),
    n: usize,
    style: &Style,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(brackets.0);
    if n == 0 {
        out.push(brackets.1);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &style.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for i in 0..n {
        if out.len() > MAX_RENDERED_BYTES {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: the text exceeds {MAX_RENDERED_BYTES} bytes"),
            ));
        }
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        newline(out, depth + 1);
        item(out, i)?;
    }
    newline(out, depth);
    out.push(brackets.1);
    Ok(())
}

/// JSON object keys are strings; Python turns numbers, booleans and None into their text.
fn key_text(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".to_string(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key);
            s
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be strings, not {kind}"),
            ))
        }
    })
}

/// Integers as they are; floats as Python's `repr` (`1.0`, `1e-05`, `1e+16`, `NaN`, `Infinity`).
fn write_number(out: &mut String, v: &Value) {
    if v.is_integer() {
        let _ = write!(out, "{v}");
        return;
    }
    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        // Rust's `{:?}` is the shortest round-trip form and switches to exponent notation at the
        // same thresholds as Python (exponent < -4 or >= 16); only the exponent is written differently.
        let s = format!("{f:?}");
        match s.split_once('e') {
            Some((mantissa, exp)) => {
                let (sign, digits) = match exp.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', exp),
                };
                let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
            }
            None => out.push_str(&s),
        }
    }
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
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
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(v: Value, kwargs: &[(&str, Value)]) -> String {
        let kwargs = Kwargs::from_iter(kwargs.iter().map(|(k, v)| (*k, v.clone())));
        tojson(v, kwargs).unwrap().to_string()
    }

    #[test]
    fn like_python_json_dumps() {
        let v: Value = serde_json::from_str::<serde_json::Value>(
            r#"{"n": [1, 2.5, 1e-7, 1e20, 3.0], "name": "f<x>", "none": null, "ok": true, "é": "\n\"\u0001"}"#,
        )
        .map(Value::from_serialize)
        .unwrap();
        assert_eq!(
            dumps(v.clone(), &[]),
            r#"{"n": [1, 2.5, 1e-07, 1e+20, 3.0], "name": "f<x>", "none": null, "ok": true, "é": "\n\"\u0001"}"#
        );
        assert_eq!(
            dumps(Value::from_serialize([1, 2]), &[("indent", Value::from(2))]),
            "[\n  1,\n  2\n]"
        );
        assert_eq!(
            dumps(Value::from("é😀"), &[("ensure_ascii", Value::from(true))]),
            r#""\u00e9\ud83d\ude00""#
        );
        assert_eq!(dumps(Value::from_serialize(Vec::<u8>::new()), &[]), "[]");
    }
}
