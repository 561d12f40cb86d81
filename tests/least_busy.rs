//! The example `least-busy` policy: decisions checked against hand-computed values, and
//! identical decisions from the Rust, C and C++ plugins and the built-in composition.

mod support;

use rand::{Rng, SeedableRng};
use support::*;
use switchyard::policy::SelectError;

/// Every implementation of least-busy, each at min_device_overlap_blocks = `min`.
fn implementations(min: u32) -> Vec<(String, String)> {
    let policy = |name: &str, ty: &str| {
        (name.to_owned(), format!("    - name: {name}\n      type: {ty}\n      parameters: {{min_device_overlap_blocks: {min}}}\n"))
    };
    let composed = |name: &str, prefix: &str, picker_params: &str| {
        (
            name.to_owned(),
            format!(
                "    - name: {name}\n      filters: [{{type: {prefix}.min-device-overlap, parameters: {{min_blocks: {min}}}}}]\n      scorers: [{{type: {prefix}.active-requests}}]\n      picker: {{type: {prefix}.lowest-cost{picker_params}}}\n"
            ),
        )
    };
    vec![
        policy("rust", "least-busy"),
        policy("c", "c.least-busy"),
        policy("cpp", "cpp.least-busy"),
        policy("builtin", "builtin.least-busy"),
        composed("rust-composed", "acme", ""),
        composed("c-composed", "c", ""),
        composed("cpp-composed", "cpp", ""),
        composed(
            "builtin-composed",
            "builtin",
            ", parameters: {tie_break: worker-id}",
        ),
    ]
}

fn startup(dir: &std::path::Path, min: u32) -> (switchyard::startup::Startup, Vec<String>) {
    let implementations = implementations(min);
    let mut config = format!(
        "plugins:\n  - path: {}\n  - path: {}\n  - path: {}\nworker_selection:\n  instances:\n",
        rust_plugin("least_busy").display(),
        cmake_plugin("least_busy_c").display(),
        cmake_plugin("least_busy_cpp").display()
    );
    for (_, instance) in &implementations {
        config.push_str(instance);
    }
    (
        start_yaml(dir, &config).expect("starts"),
        implementations.into_iter().map(|(n, _)| n).collect(),
    )
}

const FLEET: [W; 4] = [
    W {
        id: 1,
        device: 0,
        active: 3,
    },
    W {
        id: 2,
        device: 4,
        active: 1,
    },
    W {
        id: 3,
        device: 8,
        active: 1,
    },
    W {
        id: 4,
        device: 2,
        active: 0,
    },
];

#[test]
fn decisions_match_hand_computed_values_in_every_language() {
    let dir = tempfile::tempdir().unwrap();
    // min 0: nobody filtered, fewest active requests is worker 4.
    // min 3: workers 2 and 3 remain, both with 1 active: tie to the lowest id, 2.
    // min 5: only worker 3 remains.
    for (min, expected) in [(0, 4), (3, 2), (5, 3)] {
        let (startup, names) = startup(dir.path(), min);
        for name in &names {
            let got = select(&mut selector(&startup, name), 8, &FLEET).unwrap();
            assert_eq!(got, expected, "{name} at min_device_overlap_blocks={min}");
        }
    }
    // min 9: every worker filtered, in every language, naming the filter.
    let (startup, names) = startup(dir.path(), 9);
    for name in &names {
        let error = select(&mut selector(&startup, name), 8, &FLEET).unwrap_err();
        assert!(
            matches!(error, SelectError::AllFiltered { .. }),
            "{name}: {error}"
        );
    }
}

#[test]
fn three_languages_and_builtin_agree_on_random_fleets() {
    let dir = tempfile::tempdir().unwrap();
    let (startup, names) = startup(dir.path(), 2);
    let mut selectors: Vec<_> = names
        .iter()
        .map(|n| (n.clone(), selector(&startup, n)))
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut decided = 0;
    for _ in 0..500 {
        let size = rng.gen_range(1..40);
        let mut fleet: Vec<W> = (0..size)
            .map(|i| W {
                id: 100 + i,
                device: rng.gen_range(0..6),
                active: rng.gen_range(0..5),
            })
            .collect();
        // Candidate order is unspecified: shuffle it.
        for i in (1..fleet.len()).rev() {
            fleet.swap(i, rng.gen_range(0..=i));
        }
        let answers: Vec<_> = selectors
            .iter_mut()
            .map(|(n, s)| {
                (
                    n.clone(),
                    select(s, 8, &fleet).map_err(|e| match e {
                        // Filters are named per implementation; what matters is that all rejected.
                        SelectError::AllFiltered { .. } => "every worker filtered".to_owned(),
                        other => other.to_string(),
                    }),
                )
            })
            .collect();
        for (name, answer) in &answers[1..] {
            assert_eq!(
                answer,
                &answers[0].1,
                "{name} disagrees with {} on {:?}",
                answers[0].0,
                fleet
                    .iter()
                    .map(|w| (w.id, w.device, w.active))
                    .collect::<Vec<_>>()
            );
        }
        decided += usize::from(answers[0].1.is_ok());
    }
    assert!(
        decided > 300,
        "most fleets must have an eligible worker, got {decided}"
    );
}
