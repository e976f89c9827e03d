//! Bounds on the work and output of a chat template, so that a hostile template (from a GGUF file a
//! user loads) ends with an error instead of exhausting time or memory: a fuel budget for the
//! template's instructions, a cap on the rendered text, and widths that a filter or method pads to
//! (`tojson(indent=...)`, `indent(width)`, `format` / `.format()` field widths) kept small.
//!
//! What stays unbounded: strings that a template grows by concatenating them with themselves
//! (`s ~ s` in a loop) take memory before any of these checks sees them.

use std::io;

use minijinja::value::{Kwargs, Rest, StringInput};
use minijinja::{Error, ErrorKind, State, Value};

/// Instructions one render may execute (real chat templates take a few thousand per message).
pub const FUEL: u64 = 50_000_000;

/// Bytes one render may write (a prompt far longer than any context).
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// Widest padding a filter or method may produce (an indent, a format field width).
pub const MAX_WIDTH: usize = 256;

/// An `io::Write` into a string that fails once more than [`MAX_RENDERED_BYTES`] were written.
#[derive(Default)]
pub struct CappedOutput {
    pub bytes: Vec<u8>,
}

impl io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDERED_BYTES {
            return Err(io::Error::other(format!(
                "the rendered prompt exceeds {MAX_RENDERED_BYTES} bytes"
            )));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// An error unless `width` is at most [`MAX_WIDTH`].
pub fn check_width(what: &str, width: usize) -> Result<(), Error> {
    if width > MAX_WIDTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{what}: width {width} is over the limit of {MAX_WIDTH}"),
        ));
    }
    Ok(())
}

/// An error when a format string asks for a field wider than [`MAX_WIDTH`] (any run of digits in
/// it is taken as a possible width or precision).
pub fn check_format_widths(what: &str, format: &str) -> Result<(), Error> {
    let mut run = 0usize;
    for c in format.chars().chain(std::iter::once(' ')) {
        match c.to_digit(10) {
            Some(d) => run = run.saturating_mul(10).saturating_add(d as usize),
            None => {
                check_width(what, run)?;
                run = 0;
            }
        }
    }
    Ok(())
}

/// minijinja's `indent` filter with its width bounded.
pub fn indent(
    value: StringInput<'_>,
    width: Option<usize>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let width = match width {
        Some(w) => Some(w),
        None => kwargs.get::<Option<usize>>("width")?,
    };
    check_width("indent", width.unwrap_or(4))?;
    let first = match first {
        Some(f) => Some(f),
        None => kwargs.get::<Option<bool>>("first")?,
    };
    let blank = match blank {
        Some(b) => Some(b),
        None => kwargs.get::<Option<bool>>("blank")?,
    };
    kwargs.assert_all_used()?;
    minijinja::filters::indent(
        value,
        width,
        first,
        blank,
        Kwargs::from_iter(std::iter::empty::<(&str, Value)>()),
    )
}

/// minijinja's `format` filter with its field widths bounded.
pub fn format(state: &State, format_str: &Value, args: Rest<Value>) -> Result<Value, Error> {
    if let Some(s) = format_str.as_str() {
        check_format_widths("format", s)?;
    }
    minijinja::filters::format(state, format_str, args)
}

/// Python methods on values (`minijinja-contrib`'s pycompat), with `str.format` field widths
/// bounded.
pub fn unknown_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if method == "format" {
        if let Some(s) = value.as_str() {
            check_format_widths("str.format", s)?;
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_in_format_strings() {
        assert!(check_format_widths("f", "%5d {:>10} {0:.3f}").is_ok());
        assert!(check_format_widths("f", "%1000000000000d").is_err());
        assert!(check_format_widths("f", "{:>257}").is_err());
        assert!(check_format_widths("f", "99999999999999999999999999").is_err());
    }

    #[test]
    fn output_is_capped() {
        use std::io::Write;
        let mut out = CappedOutput::default();
        out.write_all(&vec![b'x'; MAX_RENDERED_BYTES]).unwrap();
        assert!(out.write_all(b"y").is_err());
        assert_eq!(out.bytes.len(), MAX_RENDERED_BYTES);
    }
}
