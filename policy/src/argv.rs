//! Argv rules, checked by the broker and again by the executor.

use crate::error::PolicyError;

/// What an empty or blank `command` is told.
pub const EMPTY_COMMAND: &str =
    "empty command: 'command' must name the program to run (its arguments go in 'args')";

/// An empty or blank program is S210 (the seed's Errors table); a NUL byte anywhere is a
/// plain-message failure naming the argument.
pub fn check_argv(argv: &[String]) -> Result<(), PolicyError> {
    if argv.first().is_none_or(|a| a.trim().is_empty()) {
        return Err(PolicyError::Invalid(EMPTY_COMMAND.into()));
    }
    for (i, a) in argv.iter().enumerate() {
        if a.contains('\0') {
            return Err(PolicyError::Plain(if i == 0 {
                "'command' contains a NUL byte".to_string()
            } else {
                format!("'args[{}]' contains a NUL byte", i - 1)
            }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    #[test]
    fn argv_cases() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        type Case<'a> = (&'a [&'a str], Option<(Code, &'a str)>);
        let cases: [Case; 7] = [
            (&["echo", "hi"], None),
            (&["/bin/true"], None),
            (&[], Some((Code::S210, EMPTY_COMMAND))),
            (&[""], Some((Code::S210, EMPTY_COMMAND))),
            (&["  \t"], Some((Code::S210, EMPTY_COMMAND))),
            (
                &["ec\0ho"],
                Some((Code::InvocationFailed, "'command' contains a NUL byte")),
            ),
            (
                &["echo", "a", "b\0"],
                Some((Code::InvocationFailed, "'args[1]' contains a NUL byte")),
            ),
        ];
        for (argv, want) in cases {
            let got = check_argv(&v(argv)).map_err(|e| (e.code(), e.to_string()));
            assert_eq!(
                got,
                match want {
                    None => Ok(()),
                    Some((c, m)) => Err((c, m.to_string())),
                },
                "{argv:?}"
            );
        }
    }
}
