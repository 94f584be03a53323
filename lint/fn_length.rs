//! One source file's functions over the line limit, and the out-of-line modules it
//! declares: the file parsed as Rust (`syn`), so braces in strings, comments and
//! raw strings count for nothing. Test code is left out: an item under
//! `#[cfg(test)]` (or `#[cfg(all(test, ...))]`), a `#[test]` function, and whatever
//! a test-only module holds, nested or in a file of its own.

use syn::spanned::Spanned;
use syn::visit::{self, Visit};

/// The most lines a function may have outside tests, from its `fn` line to its
/// closing brace.
pub const MAX_FN_LINES: usize = 100;

/// A function over `MAX_FN_LINES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongFn {
    pub name: String,
    /// The line of its `fn` keyword (1-based).
    pub line: usize,
    pub lines: usize,
}

/// A `mod name;` of non-test code: the file it names is read next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModDecl {
    /// The inline modules it sits in (`mod a { mod b; }` gives `["a"]`).
    pub inline_parents: Vec<String>,
    pub name: String,
    /// Its `#[path = "..."]`, if any.
    pub path_attr: Option<String>,
}

/// What one file holds, tests left out.
#[derive(Debug, Default)]
pub struct FileFindings {
    pub long_fns: Vec<LongFn>,
    pub modules: Vec<ModDecl>,
}

/// Parses `source` and returns its functions over the limit and its non-test
/// out-of-line modules.
pub fn scan(source: &str) -> syn::Result<FileFindings> {
    let file = syn::parse_file(source)?;
    let mut scanner = Scanner::default();
    scanner.visit_file(&file);
    Ok(scanner.found)
}

#[derive(Default)]
struct Scanner {
    inline_path: Vec<String>,
    found: FileFindings,
}

impl Scanner {
    fn measure(&mut self, name: &syn::Ident, fn_token: &syn::token::Fn, block: &syn::Block) {
        let first = fn_token.span().start().line;
        let last = block.brace_token.span.close().end().line;
        let lines = last + 1 - first;
        if lines > MAX_FN_LINES {
            self.found.long_fns.push(LongFn {
                name: name.to_string(),
                line: first,
                lines,
            });
        }
    }
}

impl<'ast> Visit<'ast> for Scanner {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if is_test_only(&item.attrs) {
            return;
        }
        match &item.content {
            Some(_) => {
                self.inline_path.push(item.ident.to_string());
                visit::visit_item_mod(self, item);
                self.inline_path.pop();
            }
            None => self.found.modules.push(ModDecl {
                inline_parents: self.inline_path.clone(),
                name: item.ident.to_string(),
                path_attr: path_attr(&item.attrs),
            }),
        }
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if is_test_only(&item.attrs) {
            return;
        }
        self.measure(&item.sig.ident, &item.sig.fn_token, &item.block);
        visit::visit_item_fn(self, item);
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if is_test_only(&item.attrs) {
            return;
        }
        self.measure(&item.sig.ident, &item.sig.fn_token, &item.block);
        visit::visit_impl_item_fn(self, item);
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if is_test_only(&item.attrs) {
            return;
        }
        if let Some(block) = &item.default {
            self.measure(&item.sig.ident, &item.sig.fn_token, block);
        }
        visit::visit_trait_item_fn(self, item);
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if !is_test_only(&item.attrs) {
            visit::visit_item_impl(self, item);
        }
    }

    fn visit_item_trait(&mut self, item: &'ast syn::ItemTrait) {
        if !is_test_only(&item.attrs) {
            visit::visit_item_trait(self, item);
        }
    }

    fn visit_item_const(&mut self, item: &'ast syn::ItemConst) {
        if !is_test_only(&item.attrs) {
            visit::visit_item_const(self, item);
        }
    }
}

/// `#[test]`, `#[cfg(test)]` or a `cfg` that needs `test` (`all(test, ...)`).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if attr.path().is_ident("test") {
            return true;
        }
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|predicate| needs_test(&predicate))
    })
}

fn needs_test(predicate: &syn::Meta) -> bool {
    match predicate {
        syn::Meta::Path(path) => path.is_ident("test"),
        syn::Meta::List(list) if list.path.is_ident("all") => list
            .parse_args_with(
                syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
            )
            .is_ok_and(|all| all.iter().any(needs_test)),
        _ => false,
    }
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| match &attr.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}
