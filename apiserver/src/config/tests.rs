use clap::Parser as _;

use super::*;

fn granted(args: &[&str]) -> Vec<String> {
    let cli = Cli::try_parse_from(std::iter::once("server").chain(args.iter().copied()))
        .expect("the flags parse");
    cli.serve.registry_args().registry_credential_namespaces
}

/// Credentials that name no namespace go to the namespaces the installation names, and to
/// every namespace only when `*` says so.
#[test]
fn credentials_are_granted_to_the_named_namespaces() {
    assert_eq!(granted(&[]), [OPERATOR_NAMESPACE]);
    assert_eq!(granted(&["--namespace", "a,b"]), ["a", "b"]);
    assert_eq!(
        granted(&["--namespace", "a", "--registry-credential-namespace", "c"]),
        ["c"]
    );
    assert_eq!(granted(&["--registry-credential-namespace", "*"]), ["*"]);
}
