//! The limits the build keeps on podnet's own source (`make lint` runs this test
//! binary, `cargo test --test lint_limits`): no function outside tests over
//! `MAX_FN_LINES` lines. The crate's source is parsed as Rust; test code (under
//! `#[cfg(test)]`, `#[test]`, and `integration/`) is left out.

mod fn_length;
mod module_tree;

use std::path::Path;

use fn_length::MAX_FN_LINES;

#[test]
fn no_function_outside_tests_is_over_the_limit() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (findings, files_read) =
        module_tree::long_functions(crate_dir, &["src/lib.rs", "src/main.rs"])
            .unwrap_or_else(|e| panic!("reading the crate's source: {e}"));
    assert!(files_read > 100, "only {files_read} source files read");
    let listed: Vec<String> = findings
        .iter()
        .map(|f| {
            format!(
                "  {}:{} `{}`: {} lines",
                f.file.display(),
                f.long_fn.line,
                f.long_fn.name,
                f.long_fn.lines
            )
        })
        .collect();
    assert!(
        listed.is_empty(),
        "{} function(s) outside tests over the limit of {MAX_FN_LINES} lines (from the \
         `fn` line to the closing brace); split each into named steps:\n{}",
        listed.len(),
        listed.join("\n")
    );
}

/// The checker itself, on small sources.
mod checker {
    use super::fn_length::{LongFn, MAX_FN_LINES, scan};

    /// A function `name` of exactly `lines` lines, its `fn` on the first.
    fn function(name: &str, lines: usize) -> String {
        let mut text = format!("fn {name}() {{\n");
        for i in 0..lines - 2 {
            text.push_str(&format!("    let _x{i} = \"}}{{\"; // }}\n"));
        }
        text.push_str("}\n");
        text
    }

    fn long(source: &str) -> Vec<LongFn> {
        scan(source).expect("parses").long_fns
    }

    #[test]
    fn a_function_at_the_limit_passes() {
        assert_eq!(long(&function("at_limit", MAX_FN_LINES)), vec![]);
    }

    #[test]
    fn a_function_one_line_over_fails_with_its_line_and_length() {
        let source = format!(
            "\n/// Doc.\n#[inline]\n{}",
            function("over", MAX_FN_LINES + 1)
        );
        assert_eq!(
            long(&source),
            vec![LongFn {
                name: "over".into(),
                line: 4,
                lines: MAX_FN_LINES + 1
            }]
        );
    }

    #[test]
    fn test_code_is_left_out() {
        let body = function("long_test_helper", 150);
        let source = format!(
            "#[cfg(test)]\nmod tests {{\n{body}}}\n\
             #[cfg(all(test, unix))]\nmod unix_tests {{\n{body}}}\n\
             #[cfg(test)]\n{body}\
             #[test]\n{}\
             #[cfg(test)]\nmod tests_in_a_file;\n",
            function("a_test", 150)
        );
        let found = scan(&source).expect("parses");
        assert_eq!(found.long_fns, vec![]);
        assert_eq!(
            found.modules,
            vec![],
            "a test-only module's file is not read"
        );
    }

    #[test]
    fn not_test_cfg_is_not_a_test() {
        let source = format!("#[cfg(not(test))]\n{}", function("real", 150));
        assert_eq!(long(&source).len(), 1);
    }

    #[test]
    fn methods_trait_defaults_and_nested_functions_count() {
        let source = format!(
            "impl S {{\n{}}}\ntrait T {{\n{}    fn required(&self);\n}}\n\
             fn outer() {{\n{}}}\nmod inline {{\n{}}}\n",
            function("method", 101),
            function("default_method", 102),
            function("nested", 103),
            function("in_inline_mod", 104),
        );
        let names: Vec<(String, usize)> = long(&source)
            .into_iter()
            .map(|f| (f.name, f.lines))
            .collect();
        assert_eq!(
            names,
            vec![
                ("method".to_string(), 101),
                ("default_method".to_string(), 102),
                ("outer".to_string(), 105),
                ("nested".to_string(), 103),
                ("in_inline_mod".to_string(), 104),
            ]
        );
    }

    #[test]
    fn out_of_line_modules_are_listed_with_their_path() {
        let source = "mod a;\n#[path = \"x/y.rs\"]\nmod b;\nmod c {\n    mod d;\n}\n";
        let modules: Vec<(Vec<String>, String, Option<String>)> = scan(source)
            .expect("parses")
            .modules
            .into_iter()
            .map(|m| (m.inline_parents, m.name, m.path_attr))
            .collect();
        assert_eq!(
            modules,
            vec![
                (vec![], "a".to_string(), None),
                (vec![], "b".to_string(), Some("x/y.rs".to_string())),
                (vec!["c".to_string()], "d".to_string(), None),
            ]
        );
    }
}
