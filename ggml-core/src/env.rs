//! Settings read from the environment, one spelling for every crate. Each crate gathers its
//! `GGML_TP_*` variables into one typed settings struct, read once through these functions (the
//! README's settings table lists them all):
//! - [`flag`]: unset or empty means the default, `0`, `off` and `false` mean off, anything else on;
//! - [`count`]: a positive whole number (unset, empty, `0` or unreadable: none);
//! - [`bytes`]: a byte count, or `off` / `never` for [`usize::MAX`] (a threshold never reached);
//! - [`text`]: the value as it is (unset or empty: none);
//! - [`choice`]: one of a few names (case-insensitive);
//! - [`dtypes`]: element type names separated by commas (`q4_0,q8_0`), or `none` for no type.
//!
//! [`cache_dir`] is the user's cache folder of ggml-tp that every clone on the machine shares
//! (`$XDG_CACHE_HOME/ggml-tp`, else `~/.cache/ggml-tp`); [`models_cache_dir`] holds the downloaded
//! models there.
//!
//! A value that cannot be read is reported once on stderr and treated as unset.

use crate::dtype::DType;
use std::path::PathBuf;

/// The switch `var`, or `default` when it is unset or empty.
pub fn flag(var: &str, default: bool) -> bool {
    parse_flag(text(var).as_deref(), default)
}

/// The positive count in `var`.
pub fn count(var: &str) -> Option<usize> {
    let value = text(var)?;
    let parsed = parse_count(&value);
    if parsed.is_none() {
        warn(var, &value, "a positive whole number");
    }
    parsed
}

/// The byte count in `var` (`off` or `never`: [`usize::MAX`]).
pub fn bytes(var: &str) -> Option<usize> {
    let value = text(var)?;
    let parsed = parse_bytes(&value);
    if parsed.is_none() {
        warn(var, &value, "a byte count, `off` or `never`");
    }
    parsed
}

/// The element types named in `var` (see [`DType::name`]), separated by commas; `none` for no
/// type.
pub fn dtypes(var: &str) -> Option<Vec<DType>> {
    let value = text(var)?;
    let parsed = parse_dtypes(&value);
    if parsed.is_none() {
        warn(var, &value, "type names separated by commas, or `none`");
    }
    parsed
}

fn parse_dtypes(value: &str) -> Option<Vec<DType>> {
    if value.eq_ignore_ascii_case("none") {
        return Some(Vec::new());
    }
    value
        .split(',')
        .map(|name| DType::from_name(name.trim()))
        .collect()
}

/// The value of `var`, trimmed; none when unset or empty.
pub fn text(var: &str) -> Option<String> {
    let value = std::env::var(var).ok()?;
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_string())
}

/// The index of the name in `choices` that `var` holds (case-insensitive); none when unset, empty
/// or another name.
pub fn choice(var: &str, choices: &[&str]) -> Option<usize> {
    let value = text(var)?;
    let found = parse_choice(&value, choices);
    if found.is_none() {
        warn(var, &value, &format!("one of {}", choices.join(", ")));
    }
    found
}

/// The value of `var` as a path; none when unset or empty.
pub fn path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The user's cache folder of ggml-tp, shared by every clone on the machine:
/// `$XDG_CACHE_HOME/ggml-tp`, else `$HOME/.cache/ggml-tp` (as the XDG base directory specification
/// and the Hugging Face hub cache do); none when neither variable gives an absolute path.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(path("XDG_CACHE_HOME"), path("HOME")).map(|c| c.join("ggml-tp"))
}

/// The folder downloaded models are kept in: `models` in [`cache_dir`].
pub fn models_cache_dir() -> Option<PathBuf> {
    cache_dir().map(|c| c.join("models"))
}

/// The user's cache folder from `XDG_CACHE_HOME` and `HOME`: a relative `XDG_CACHE_HOME` is
/// ignored, as the specification says.
fn cache_dir_from(xdg_cache_home: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
    xdg_cache_home
        .filter(|p| p.is_absolute())
        .or_else(|| home.filter(|h| h.is_absolute()).map(|h| h.join(".cache")))
}

fn parse_flag(value: Option<&str>, default: bool) -> bool {
    match value {
        None | Some("") => default,
        Some("0" | "off" | "false") => false,
        Some(_) => true,
    }
}

fn parse_count(value: &str) -> Option<usize> {
    value.parse().ok().filter(|&n: &usize| n > 0)
}

fn parse_choice(value: &str, choices: &[&str]) -> Option<usize> {
    choices.iter().position(|c| c.eq_ignore_ascii_case(value))
}

fn parse_bytes(value: &str) -> Option<usize> {
    match value {
        "off" | "never" => Some(usize::MAX),
        n => n.parse().ok(),
    }
}

fn warn(var: &str, value: &str, expected: &str) {
    eprintln!("ggml-tp: {var}={value:?} is not {expected}; ignored");
}

#[cfg(test)]
mod tests {
    use super::{cache_dir_from, parse_bytes, parse_choice, parse_count, parse_dtypes, parse_flag};
    use crate::dtype::DType;

    #[test]
    fn type_lists() {
        assert_eq!(parse_dtypes("q8_0"), Some(vec![DType::Q8_0]));
        assert_eq!(
            parse_dtypes("Q4_0, q8_0"),
            Some(vec![DType::Q4_0, DType::Q8_0])
        );
        assert_eq!(parse_dtypes("none"), Some(vec![]));
        assert_eq!(parse_dtypes("q8_0,nope"), None);
        assert_eq!(parse_dtypes(""), None);
    }
    use std::path::PathBuf;

    #[test]
    fn unset_and_empty_keep_the_default_the_rest_decides() {
        for default in [false, true] {
            assert_eq!(parse_flag(None, default), default);
            assert_eq!(parse_flag(Some(""), default), default);
            for off in ["0", "off", "false"] {
                assert!(!parse_flag(Some(off), default), "{off}");
            }
            for on in ["1", "on", "yes"] {
                assert!(parse_flag(Some(on), default), "{on}");
            }
        }
    }

    #[test]
    fn choices_are_names_in_any_case() {
        let names = ["each", "one"];
        assert_eq!(parse_choice("each", &names), Some(0));
        assert_eq!(parse_choice("ONE", &names), Some(1));
        assert_eq!(parse_choice("two", &names), None);
    }

    #[test]
    fn counts_are_positive_and_bytes_may_be_off() {
        assert_eq!(parse_count("3"), Some(3));
        for bad in ["0", "-1", "x", "1.5"] {
            assert_eq!(parse_count(bad), None, "{bad}");
        }
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("1048576"), Some(1 << 20));
        assert_eq!(parse_bytes("off"), Some(usize::MAX));
        assert_eq!(parse_bytes("never"), Some(usize::MAX));
        assert_eq!(parse_bytes("1M"), None);
    }

    #[test]
    fn text_is_trimmed_and_empty_is_unset() {
        // A variable name no one sets.
        assert_eq!(super::text("GGML_TP_TEST_UNSET_VARIABLE_CORE"), None);
        assert_eq!(super::count("GGML_TP_TEST_UNSET_VARIABLE_CORE"), None);
        assert_eq!(super::bytes("GGML_TP_TEST_UNSET_VARIABLE_CORE"), None);
        assert!(super::flag("GGML_TP_TEST_UNSET_VARIABLE_CORE", true));
    }

    #[test]
    fn the_cache_is_xdg_cache_home_else_dot_cache_in_home() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(cache_dir_from(p("/x/cache"), p("/home/u")), p("/x/cache"));
        assert_eq!(cache_dir_from(None, p("/home/u")), p("/home/u/.cache"));
        assert_eq!(
            cache_dir_from(p("rel/cache"), p("/home/u")),
            p("/home/u/.cache")
        );
        assert_eq!(cache_dir_from(None, p("rel")), None);
        assert_eq!(cache_dir_from(None, None), None);
    }
}
