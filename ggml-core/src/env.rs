//! On/off switches read from the environment, one spelling for every crate: unset or empty means
//! the default, `0`, `off` and `false` mean off, anything else on.

/// The switch `var`, or `default` when it is unset or empty.
pub fn flag(var: &str, default: bool) -> bool {
    parse_flag(std::env::var(var).ok().as_deref(), default)
}

fn parse_flag(value: Option<&str>, default: bool) -> bool {
    match value {
        None | Some("") => default,
        Some("0" | "off" | "false") => false,
        Some(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_flag;

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
}
