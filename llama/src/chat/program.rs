//! A chat template's compiled instructions (minijinja's `unstable_machinery`) rewritten so that every
//! instruction that can grow text or a list goes through the checks of [`super::limits`]:
//!
//! * `~` becomes a call of [`CONCAT`], which builds the text within the render's text budget;
//! * `+` and `*` are preceded by a guard ([`GUARD_ADD`], [`GUARD_MUL`]) that charges the strings
//!   they will build and bounds the lists, then gives its operands back (as a list the next
//!   instruction unpacks), so minijinja's own operators compute the result;
//! * every filter, method, function and object call is followed by [`CHECK`], which charges the
//!   string it returned;
//! * raw template text is written through the formatter like `{{ }}` output, so that all output,
//!   also into `{% set %}` blocks, is charged.
//!
//! Jump targets are moved to follow the inserted instructions. The names of the helpers start with
//! [`RESERVED`], which templates may not use (so that they cannot replace them).

use std::collections::BTreeMap;

use minijinja::machinery::{CompiledTemplate, Instruction, Instructions};
use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, Error};

use super::limits;

/// The prefix of the helpers' names.
pub const RESERVED: &str = "__ggml_tp_";
/// `a ~ b` within the text budget.
const CONCAT: &str = "__ggml_tp_concat";
/// Checks the operands of `+`.
const GUARD_ADD: &str = "__ggml_tp_guard_add";
/// Checks the operands of `*`.
const GUARD_MUL: &str = "__ggml_tp_guard_mul";
/// Charges a call's result.
const CHECK: &str = "__ggml_tp_check";

/// Registers the helpers and the charging formatter in `env`.
pub fn install(env: &mut Environment<'static>) {
    env.add_function(CONCAT, |a: Value, b: Value| -> Result<Value, Error> {
        if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
            limits::charge(x.len().saturating_add(y.len()))?;
            return Ok(Value::from([x, y].concat()));
        }
        limits::charged_text(format_args!("{a}{b}")).map(Value::from)
    });
    env.add_function(GUARD_ADD, |a: Value, b: Value| -> Result<Value, Error> {
        if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
            limits::charge(x.len().saturating_add(y.len()))?;
        } else if let (Some(x), Some(y)) = (list_len(&a), list_len(&b)) {
            limits::check_list(x.saturating_add(y))?;
        }
        Ok(operands(a, b))
    });
    env.add_function(GUARD_MUL, |a: Value, b: Value| -> Result<Value, Error> {
        for (x, n) in [(&a, &b), (&b, &a)] {
            let Some(n) = n.as_usize() else { continue };
            if let Some(s) = x.as_str() {
                limits::charge(s.len().saturating_mul(n))?;
            } else if let Some(len) = list_len(x) {
                limits::check_list(len.saturating_mul(n))?;
            }
        }
        Ok(operands(a, b))
    });
    env.add_function(CHECK, |v: Value| -> Result<Value, Error> {
        if let Some(s) = v.as_str() {
            limits::charge(s.len())?;
        }
        Ok(v)
    });
    env.set_formatter(|out, state, value| {
        limits::charge_text_of(value)?;
        minijinja::escape_formatter(out, state, value)
    });
}

/// The length of a list or of a sequence built lazily (not of a string or a map).
fn list_len(v: &Value) -> Option<usize> {
    use minijinja::value::ValueKind;
    matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable)
        .then(|| v.len())
        .flatten()
}

/// `a` and `b` as the list that `UnpackList(2)` turns back into `a` then `b` on the stack.
fn operands(a: Value, b: Value) -> Value {
    Value::from(vec![b, a])
}

/// A template's instructions and blocks, rewritten.
pub struct Program<'s> {
    pub main: Instructions<'s>,
    pub blocks: BTreeMap<&'s str, Instructions<'s>>,
    pub auto_escape: AutoEscape,
}

impl<'s> Program<'s> {
    pub fn of(compiled: &CompiledTemplate<'s>) -> Program<'s> {
        Program {
            main: rewrite(&compiled.instructions),
            blocks: compiled
                .blocks
                .iter()
                .map(|(name, block)| (*name, rewrite(block)))
                .collect(),
            auto_escape: compiled.initial_auto_escape,
        }
    }
}

/// The instructions that replace `instr`, with `jump` moving a jump target.
fn replacement<'s>(instr: &Instruction<'s>, jump: impl Fn(u32) -> u32) -> Vec<Instruction<'s>> {
    use Instruction as I;
    match instr.clone() {
        I::EmitRaw(text) => vec![I::LoadConst(Value::from(text)), I::Emit],
        I::StringConcat => vec![I::CallFunction(CONCAT, Some(2))],
        I::Add => vec![
            I::CallFunction(GUARD_ADD, Some(2)),
            I::UnpackList(2),
            I::Add,
        ],
        I::Mul => vec![
            I::CallFunction(GUARD_MUL, Some(2)),
            I::UnpackList(2),
            I::Mul,
        ],
        call @ (I::ApplyFilter(..)
        | I::CallMethod(..)
        | I::CallFunction(..)
        | I::CallObject(..)) => {
            vec![call, I::CallFunction(CHECK, Some(1))]
        }
        I::Jump(t) => vec![I::Jump(jump(t))],
        I::JumpIfFalse(t) => vec![I::JumpIfFalse(jump(t))],
        I::JumpIfFalseOrPop(t) => vec![I::JumpIfFalseOrPop(jump(t))],
        I::JumpIfTrueOrPop(t) => vec![I::JumpIfTrueOrPop(jump(t))],
        I::Iterate(t) => vec![I::Iterate(jump(t))],
        I::BuildMacro(name, t, flags) => vec![I::BuildMacro(name, jump(t), flags)],
        other => vec![other],
    }
}

fn rewrite<'s>(src: &Instructions<'s>) -> Instructions<'s> {
    let n = src.len() as u32;
    let instr = |idx: u32| src.get(idx).expect("an index below the length");
    // Where each old instruction starts in the new program (and the end, a valid target too).
    let mut start = Vec::with_capacity(src.len() + 1);
    let mut at = 0u32;
    for idx in 0..n {
        start.push(at);
        at += replacement(instr(idx), |t| t).len() as u32;
    }
    start.push(at);
    let jump = |t: u32| start.get(t as usize).copied().unwrap_or(at);
    let mut out = Instructions::new(src.name(), src.source());
    for idx in 0..n {
        let line = src.get_line(idx).and_then(|l| u16::try_from(l).ok());
        for new in replacement(instr(idx), jump) {
            match line {
                Some(line) => out.add_with_line(new, line),
                None => out.add(new),
            };
        }
    }
    out
}
