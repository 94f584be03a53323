//! The crate's non-test source files, found the way the compiler finds them: from
//! `src/lib.rs` and `src/main.rs` through each `mod name;` (and `#[path]`), so a
//! file reached only through a test-only module is never read.

use std::path::{Path, PathBuf};

use crate::fn_length::{self, LongFn, ModDecl};

/// A function over the limit, with the file it is in.
#[derive(Debug)]
pub struct Finding {
    pub file: PathBuf,
    pub long_fn: LongFn,
}

/// Why a walk of the crate stopped.
#[derive(Debug)]
pub enum WalkError {
    Read(PathBuf, std::io::Error),
    Parse(PathBuf, syn::Error),
    ModuleNotFound(PathBuf, String),
}

impl std::fmt::Display for WalkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WalkError::Read(file, e) => write!(f, "{}: {e}", file.display()),
            WalkError::Parse(file, e) => {
                let at = e.span().start();
                write!(f, "{}:{}:{}: {e}", file.display(), at.line, at.column)
            }
            WalkError::ModuleNotFound(file, name) => {
                write!(f, "{}: no file for `mod {name};`", file.display())
            }
        }
    }
}

/// Every function over the limit in the non-test code of the crate rooted at
/// `crate_dir`, paths relative to it; the number of files read.
pub fn long_functions(
    crate_dir: &Path,
    roots: &[&str],
) -> Result<(Vec<Finding>, usize), WalkError> {
    let mut queue: Vec<PathBuf> = roots.iter().map(PathBuf::from).collect();
    let mut findings = Vec::new();
    let mut files_read = 0;
    while let Some(file) = queue.pop() {
        let full = crate_dir.join(&file);
        let source =
            std::fs::read_to_string(&full).map_err(|e| WalkError::Read(file.clone(), e))?;
        let found = fn_length::scan(&source).map_err(|e| WalkError::Parse(file.clone(), e))?;
        files_read += 1;
        for module in &found.modules {
            queue.push(module_file(crate_dir, &file, module)?);
        }
        findings.extend(found.long_fns.into_iter().map(|long_fn| Finding {
            file: file.clone(),
            long_fn,
        }));
    }
    findings.sort_by(|a, b| (&a.file, a.long_fn.line).cmp(&(&b.file, b.long_fn.line)));
    Ok((findings, files_read))
}

/// The file `module` names, declared in `parent` (the compiler's rules: a
/// `#[path]` is relative to the parent's directory; otherwise a `mod.rs`,
/// `lib.rs` or `main.rs` holds its children beside it and `a.rs` in `a/`).
fn module_file(crate_dir: &Path, parent: &Path, module: &ModDecl) -> Result<PathBuf, WalkError> {
    let parent_dir = parent.parent().unwrap_or(Path::new(""));
    let mut dir = parent_dir.to_path_buf();
    if !module.inline_parents.is_empty() || module.path_attr.is_none() {
        let owns_dir = matches!(
            parent.file_name().and_then(|n| n.to_str()),
            Some("mod.rs" | "lib.rs" | "main.rs")
        );
        if !owns_dir && let Some(stem) = parent.file_stem() {
            dir.push(stem);
        }
        dir.extend(&module.inline_parents);
    }
    if let Some(path) = &module.path_attr {
        return Ok(dir.join(path));
    }
    [
        dir.join(format!("{}.rs", module.name)),
        dir.join(&module.name).join("mod.rs"),
    ]
    .into_iter()
    .find(|candidate| crate_dir.join(candidate).is_file())
    .ok_or_else(|| WalkError::ModuleNotFound(parent.to_path_buf(), module.name.clone()))
}
