//! Every flag a user can see says what it does in `--help`.

/// The flags of `cmd` and of its subcommands, at any depth, that a user can
/// see and that say nothing about themselves in `--help`.
fn flags_without_help(cmd: &clap::Command, path: &str) -> Vec<String> {
    let mut missing: Vec<String> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_help().is_none() && a.get_long_help().is_none())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .map(|a| format!("{path} --{}", a.get_long().unwrap_or(a.get_id().as_str())))
        .collect();
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        missing.extend(flags_without_help(
            sub,
            &format!("{path} {}", sub.get_name()),
        ));
    }
    missing
}

#[test]
fn every_flag_has_help_text() {
    use clap::CommandFactory as _;
    let mut cmd = crate::cli::command::Cli::command();
    cmd.build();
    assert_eq!(flags_without_help(&cmd, "gostw"), Vec::<String>::new());
}

/// The control: a flag declared without a doc comment is found.
#[test]
fn a_flag_without_help_is_found() {
    let cmd = clap::Command::new("t")
        .arg(clap::Arg::new("said").long("said").help("what it does"))
        .subcommand(clap::Command::new("sub").arg(clap::Arg::new("bare").long("bare")));
    assert_eq!(flags_without_help(&cmd, "t"), ["t sub --bare"]);
}
