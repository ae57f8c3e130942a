use super::*;

#[test]
fn small_bench_ends_with_the_key_value_line() {
    for weights in [WeightMode::Structured, WeightMode::Uniform] {
        let report = run(&BenchArgs {
            gpus: 120,
            jobs: 80,
            seed: 3,
            weights,
            dense: DenseMode::Auto,
            candidates_per_job: 16,
            threads: 2,
            export: None,
            pricing_budget_ms: 5000,
        })
        .expect("bench runs");
        assert_eq!(report.objective_gap, 0.0);
        assert_eq!(report.full_graph_gap, 0.0);
        assert_eq!(report.gap_reference, "dense kuhn_munkres (full graph)");
        let last = report.text.lines().last().unwrap();
        let keys: Vec<&str> = last
            .split(' ')
            .map(|kv| kv.split('=').next().unwrap())
            .collect();
        assert_eq!(
            keys,
            [
                "round_s",
                "peak_mb",
                "objective_gap",
                "full_graph_gap",
                "incremental_ms"
            ]
        );
        assert!(last.contains("objective_gap=0 full_graph_gap=0 "));
        assert!(report.matched >= report.top_k_matched);
    }
}

#[test]
fn gang_bench_places_gangs_on_free_gpus_and_ends_with_its_key_value_line() {
    let args = BenchArgs {
        gpus: 160,
        jobs: 120,
        seed: 5,
        weights: WeightMode::Structured,
        dense: DenseMode::Never,
        candidates_per_job: 16,
        threads: 2,
        export: None,
        pricing_budget_ms: 5000,
    };
    for slots in [1, 2] {
        let text = gang_run(&args, slots, 0.1).expect("gang bench runs");
        let last = text.lines().last().unwrap();
        let value = |key: &str| -> f64 {
            last.split(' ')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("{key} missing: {last}"))
                .parse()
                .unwrap()
        };
        assert!(value("gangs") > 0.0, "{text}");
        assert!(value("gangs_placed") > 0.0, "{text}");
        assert!(value("gangs_placed") <= value("gangs"));
        assert_eq!(value("slots_per_gpu"), f64::from(slots));
        // Priced out within the budget: exact over every pair.
        assert_eq!(value("singles_gap"), 0.0, "{text}");
        assert!(text.contains("3b. pricing out: exact"), "{text}");
    }
    // Without pricing: exact on its candidate graph, a small gap over
    // every pair (measured and shown, not hidden).
    let unpriced = BenchArgs {
        pricing_budget_ms: 0,
        ..args.clone()
    };
    let text = gang_run(&unpriced, 2, 0.1).expect("gang bench runs");
    assert!(text.contains("3b. pricing out: off"), "{text}");
    // More jobs than GPUs: the split steps put light jobs side by side
    // on N = 2, never on N = 1.
    let crowded = BenchArgs {
        gpus: 40,
        jobs: 120,
        ..args.clone()
    };
    let splits = |slots: u32| -> f64 {
        let text = gang_run(&crowded, slots, 0.0).expect("gang bench runs");
        let last = text.lines().last().unwrap().to_string();
        last.split(' ')
            .find_map(|kv| kv.strip_prefix("split_jobs="))
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(splits(1), 0.0);
    assert!(splits(2) > 0.0);
    assert!(gang_run(&args, 1, 1.5).is_err(), "a share above 1");
    assert!(
        gang_run(&args, 5, 0.1).is_err(),
        "more slots than offline_per_gpu allows"
    );
}

#[test]
fn export_writes_a_header_and_one_line_per_edge() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("instance.txt");
    let edges = [
        Edge {
            job: 0,
            gpu: 2,
            weight: 5,
        },
        Edge {
            job: 1,
            gpu: 0,
            weight: 7,
        },
    ];
    export(&path, 2, 3, &edges).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text, "# jobs gpus edges\n2 3 2\n0 2 5\n1 0 7\n");
    let err = export(&dir.path().join("no/such/dir/f"), 1, 1, &edges).unwrap_err();
    assert!(format!("{err:#}").contains("no/such/dir/f"), "{err:#}");
}
