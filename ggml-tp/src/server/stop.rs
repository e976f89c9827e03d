//! Stop strings: cutting generated text at the first one, holding back a tail that could be the
//! start of one.

/// Cuts generated text at the first stop string, holding back a tail that could be the start of
/// one until the next text shows whether it is.
#[derive(Debug, Default)]
pub struct StopFilter {
    stops: Vec<String>,
    held: String,
    pub hit: bool,
}

impl StopFilter {
    pub fn new(stops: Vec<String>) -> StopFilter {
        StopFilter {
            stops,
            ..StopFilter::default()
        }
    }

    /// Adds `text`; returns the text that is safe to send and whether a stop string was reached
    /// (then nothing after it is ever sent).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.hit {
            return (String::new(), true);
        }
        self.held.push_str(text);
        if let Some(pos) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.hit = true;
            let out = self.held[..pos].to_string();
            self.held.clear();
            return (out, true);
        }
        let keep_from = (0..=self.held.len())
            .filter(|&k| self.held.is_char_boundary(k))
            .find(|&k| {
                let tail = &self.held[k..];
                tail.is_empty() || self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let out = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        (out, false)
    }

    /// The held-back text at the end of the generation.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_filter_holds_possible_prefixes() {
        let mut f = StopFilter::new(vec!["</s>".into(), "END".into()]);
        assert_eq!(f.push("hello <"), ("hello ".to_string(), false));
        assert_eq!(f.push("/"), (String::new(), false));
        assert_eq!(f.push("x"), ("</x".to_string(), false));
        assert_eq!(f.push("ab E"), ("ab ".to_string(), false));
        assert_eq!(f.push("NDtail"), (String::new(), true));
        assert_eq!(f.push("more"), (String::new(), true));
        let mut g = StopFilter::new(vec![]);
        assert_eq!(g.push("é<"), ("é<".to_string(), false));
        let mut h = StopFilter::new(vec!["ab".into()]);
        assert_eq!(h.push("xa"), ("x".to_string(), false));
        assert_eq!(h.flush(), "a");
    }
}
