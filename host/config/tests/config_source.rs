//! The config layer on its own, through its public API: a config text parsed and
//! validated without starting anything, and every error naming the file, the line, what
//! was wrong and what to do.

use std::path::{Path, PathBuf};

use switchyard_config::{ConfigError, ConfigSource};

/// `text` parsed as the file `config.yaml` of the current folder.
fn parse(text: &str) -> Result<ConfigSource, ConfigError> {
    ConfigSource::parse(text.to_owned(), "config.yaml".to_owned(), PathBuf::new())
}

/// The errors `validate` finds in `text`, as the operator reads them.
fn validation_errors(text: &str) -> Vec<String> {
    let source = parse(text).unwrap_or_else(|e| panic!("{e}"));
    let (errors, _) = source.validate();
    errors.iter().map(ToString::to_string).collect()
}

#[test]
fn the_embedded_default_parses_and_validates_clean() {
    let source = ConfigSource::embedded().unwrap_or_else(|e| panic!("{e}"));
    let (errors, _) = source.validate();
    assert!(errors.is_empty(), "{errors:#?}");
    assert!(!source.instance_names().is_empty());
}

#[test]
fn a_yaml_error_names_the_file_and_its_line() {
    let error = parse("router:\n  block_size: 16\nworkers:\n  - {model: demo, worker_id: 1\n")
        .err()
        .expect("an unclosed flow mapping is refused");
    assert_eq!(error.file, "config.yaml");
    assert!(error.line.is_some_and(|l| l >= 4), "{error:?}");
    assert!(
        error.to_string().contains("docs/configuration.md"),
        "{error}"
    );
}

#[test]
fn an_unknown_key_is_refused_with_its_line() {
    let error = parse("router:\n  block_sise: 16\n")
        .err()
        .expect("a misspelt key is refused");
    assert_eq!(error.line, Some(2), "{error}");
    assert!(error.message.contains("block_sise"), "{error}");
}

#[test]
fn a_knob_that_must_be_positive_names_its_line() {
    let errors = validation_errors("router:\n  request_expiry_secs: 0\n");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].starts_with("config.yaml:2: "), "{errors:#?}");
    assert!(errors[0].contains("request_expiry_secs"), "{errors:#?}");
}

#[test]
fn a_config_file_that_cannot_be_read_says_what_to_check() {
    let missing = Path::new("/nonexistent/switchyard/config.yaml");
    let error = ConfigSource::from_file(missing)
        .err()
        .expect("no such file");
    assert_eq!(error.file, missing.display().to_string());
    assert!(error.message.contains("Check the --config path"), "{error}");
}
