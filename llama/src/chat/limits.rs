//! Bounds on the work and output of a chat template, so that a hostile template (from a GGUF file a
//! user loads) ends with an error instead of exhausting time or memory: a fuel budget for the
//! template's instructions, a budget of the text one render may build, and widths that a filter or
//! method pads to (`tojson(indent=...)`, `indent(width)`, `format` / `.format()` field widths) kept
//! small.
//!
//! The text budget ([`TEXT_BUDGET`], per render, counted on the rendering thread) is charged with
//! every byte the template writes (to the prompt or into a `{% set %}` block), every string that
//! `~`, `+` or `*` builds and every string a filter, method or function returns; filters that can
//! multiply their input (`join`, `replace`, `indent`, `format` and their method forms) are charged
//! what they may build before they build it. Lists that `+` or `*` build are bounded by
//! [`MAX_LIST_ITEMS`]. So a template that doubles a string or a list in a loop stops with an error
//! after at most the budget of memory. [`super::program`] routes the instructions through these
//! checks.

use std::cell::Cell;
use std::fmt;

use minijinja::value::{Kwargs, Rest, StringInput};
use minijinja::{Error, ErrorKind, State, Value};

/// Instructions one render may execute (real chat templates take a few thousand per message).
pub const FUEL: u64 = 50_000_000;

/// Bytes one render may write (a prompt far longer than any context).
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// Bytes of text one render may build in all (written, concatenated, returned by filters).
pub const TEXT_BUDGET: usize = 128 << 20;

/// Items of a list that `+` or `*` builds (more than the 100,000 of minijinja's `range`).
pub const MAX_LIST_ITEMS: usize = 1 << 17;

thread_local! {
    /// What is left of the text budget of the render on this thread (`None` outside renders).
    static TEXT_LEFT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The text budget of a render on this thread while it is held (the previous one comes back when
/// it is dropped).
pub struct Budget(Option<usize>);

impl Budget {
    pub fn start() -> Budget {
        Budget(TEXT_LEFT.replace(Some(TEXT_BUDGET)))
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        TEXT_LEFT.set(self.0);
    }
}

fn over_budget() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("the template builds more than {TEXT_BUDGET} bytes of text"),
    )
}

/// Takes `bytes` from the render's text budget; an error when it does not hold them.
pub fn charge(bytes: usize) -> Result<(), Error> {
    TEXT_LEFT.with(|left| match left.get().map(|l| l.checked_sub(bytes)) {
        None => Ok(()),
        Some(Some(l)) => {
            left.set(Some(l));
            Ok(())
        }
        Some(None) => Err(over_budget()),
    })
}

/// A `fmt::Write` that charges what it writes, and keeps it where it has a string.
struct Charged<'a>(Option<&'a mut String>);

impl fmt::Write for Charged<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        charge(s.len()).map_err(|_| fmt::Error)?;
        if let Some(out) = &mut self.0 {
            out.push_str(s);
        }
        Ok(())
    }
}

/// The text `args` format to, charged (writing stops at the end of the budget, so a value whose
/// text is endless costs bounded time).
pub fn charged_text(args: fmt::Arguments<'_>) -> Result<String, Error> {
    let mut s = String::new();
    fmt::write(&mut Charged(Some(&mut s)), args).map_err(|_| over_budget())?;
    Ok(s)
}

/// Charges the length of `value`'s text without keeping it.
pub fn charge_text_of(value: &Value) -> Result<(), Error> {
    match value.as_str() {
        Some(s) => charge(s.len()),
        None => fmt::write(&mut Charged(None), format_args!("{value}")).map_err(|_| over_budget()),
    }
}

/// An error when a list of `items` is over [`MAX_LIST_ITEMS`].
pub fn check_list(items: usize) -> Result<(), Error> {
    if items > MAX_LIST_ITEMS {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("a list of {items} items is over the limit of {MAX_LIST_ITEMS}"),
        ));
    }
    Ok(())
}

/// Charges what replacing every `from` in `value` by `to` may build.
pub fn charge_replace(value: &str, from: &str, to: &str) -> Result<(), Error> {
    let count = if from.is_empty() {
        value.chars().count() + 1
    } else {
        value.matches(from).count()
    };
    charge(value.len().saturating_add(count.saturating_mul(to.len())))
}

/// Charges what joining `items` with `joiner` builds.
pub fn charge_join(items: &Value, joiner: &str) -> Result<(), Error> {
    for (i, item) in items.try_iter()?.enumerate() {
        charge(if i > 0 { joiner.len() } else { 0 })?;
        charge_text_of(&item)?;
    }
    Ok(())
}

/// Charges what formatting `args` into `format` may build (each field padded at most to
/// [`MAX_WIDTH`]).
fn charge_format(format: &str, args: &[Value]) -> Result<(), Error> {
    let fields = format.matches(['%', '{']).count();
    charge(
        format
            .len()
            .saturating_add(fields.saturating_mul(MAX_WIDTH)),
    )?;
    args.iter().try_for_each(charge_text_of)
}

/// Widest padding a filter or method may produce (an indent, a format field width).
pub const MAX_WIDTH: usize = 256;

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
    let lines = value.as_str().lines().count() + 1;
    charge(lines.saturating_mul(width.unwrap_or(4)))?;
    minijinja::filters::indent(
        value,
        width,
        first,
        blank,
        Kwargs::from_iter(std::iter::empty::<(&str, Value)>()),
    )
}

/// minijinja's `replace` filter, charged what it may build.
pub fn replace(
    state: &State,
    value: StringInput<'_>,
    from: StringInput<'_>,
    to: StringInput<'_>,
) -> Result<Value, Error> {
    charge_replace(value.as_str(), from.as_str(), to.as_str())?;
    minijinja::filters::replace(state, value, from, to)
}

/// minijinja's `join` filter, charged what it builds.
pub fn join(state: &State, value: &Value, joiner: Option<StringInput<'_>>) -> Result<Value, Error> {
    charge_join(value, joiner.as_ref().map_or("", |j| j.as_str()))?;
    minijinja::filters::join(state, value, joiner)
}

/// minijinja's `format` filter with its field widths bounded.
pub fn format(state: &State, format_str: &Value, args: Rest<Value>) -> Result<Value, Error> {
    if let Some(s) = format_str.as_str() {
        check_format_widths("format", s)?;
        charge_format(s, &args)?;
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
    match (method, value.as_str(), args) {
        ("format", Some(s), _) => {
            check_format_widths("str.format", s)?;
            charge_format(s, args)?;
        }
        ("replace", Some(s), [from, to, ..]) => {
            charge_replace(s, &from.to_string(), &to.to_string())?;
        }
        ("join", Some(joiner), [items, ..]) => charge_join(items, joiner)?,
        _ => {}
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
    fn the_text_budget_is_per_render_and_runs_out() {
        assert!(charge(usize::MAX).is_ok(), "unbounded outside a render");
        {
            let _budget = Budget::start();
            assert_eq!(charged_text(format_args!("{}", "ab")).unwrap(), "ab");
            charge(TEXT_BUDGET - 2).unwrap();
            assert!(charge(1).is_err());
            let list = Value::from_iter(std::iter::repeat_n(Value::from("x"), 1000));
            assert!(charge_text_of(&list).is_err());
        }
        assert!(
            charge(usize::MAX).is_ok(),
            "the budget ended with the render"
        );
        assert!(check_list(MAX_LIST_ITEMS).is_ok() && check_list(MAX_LIST_ITEMS + 1).is_err());
    }
}
