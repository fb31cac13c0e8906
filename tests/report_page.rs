//! report.html read in a real browser (Debian's Chromium, headless; job-scripts/run-tests.sh
//! installs it): the page loads with no console message (it has no script, so any is a
//! fault), the verdict report.json holds is in the rendered DOM, every inline SVG declares
//! a non-zero size, and a screenshot of its first screen is not blank. The screenshot is
//! kept in the test's folder (printed). Also: the terminal tables print run ids whole.
//! Inputs: the schema-2 run folders and sweep in tests/fixtures/schema2 (see its README).

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema2")
}

/// `reduce` of the study's runs, the two single runs and the sweep into `out`.
fn reduce_fixtures(out: &Path) -> Job {
    let f = fixtures();
    let job = ddpbench(&[
        "reduce",
        &path_str(&f.join("study/runs")),
        &path_str(&f.join("single")),
        &path_str(&f.join("sweep")),
        "--out",
        &path_str(out),
    ]);
    job.assert_ok();
    job
}

/// Chromium headless on `page` with `args`; its stdout and stderr.
fn chromium(dir: &Path, page: &Path, args: &[&str]) -> (String, String) {
    let out = Command::new("chromium")
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", dir.join("chromium-profile").display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium not found: install it (apt-get install chromium; job-scripts/run-tests.sh does)");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The value of attribute `name` in the tag text `tag`.
fn attr(tag: &str, name: &str) -> Option<String> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(tag[at..at + tag[at..].find('"')?].to_string())
}

#[test]
fn report_page_renders_in_a_browser() {
    let dir = tmp().keep();
    let out = dir.join("report");
    let job = reduce_fixtures(&out);
    let page = out.join("report.html");
    assert!(page.is_file(), "no report.html in {}", out.display());
    let (dom, log) = chromium(&dir, &page, &["--dump-dom"]);
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:#?}");
    // The verdict the report found, as the DOM writes its text.
    let report = json(&out.join("report.json"));
    let verdict = report["workloads"][0]["verdict"].as_str().unwrap();
    let words: String = verdict.chars().take(60).collect::<String>().replace('&', "&amp;");
    assert!(dom.contains(&words), "verdict {words:?} not in the rendered page");
    let svgs: Vec<&str> = dom
        .match_indices("<svg")
        .map(|(i, _)| &dom[i..i + dom[i..].find('>').unwrap()])
        .collect();
    assert!(svgs.len() >= 6, "{} inline SVGs", svgs.len());
    for s in &svgs {
        for d in ["width", "height"] {
            let v: f64 = attr(s, d).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            assert!(v > 0.0, "an inline SVG with no {d}: {s}");
        }
    }
    // The sections in the order a reader needs them.
    let at = |t: &str| dom.find(t).unwrap_or_else(|| panic!("{t:?} not in the page"));
    let order = [
        "What to run",
        "Speedup and efficiency",
        "Where the ideal throughput went",
        "Where the step goes",
        "Who is late",
        "Projection",
        "Tables",
        "Files",
    ];
    for pair in order.windows(2) {
        assert!(
            at(&format!(">{}", pair[0])) < at(&format!(">{}", pair[1])),
            "{} after {}",
            pair[0],
            pair[1]
        );
    }
    let shot = dir.join("report-first-screen.png");
    chromium(
        &dir,
        &page,
        &[&format!("--screenshot={}", shot.display()), "--window-size=1200,900"],
    );
    let png = resvg::tiny_skia::Pixmap::decode_png(&std::fs::read(&shot).unwrap()).unwrap();
    let inked = png
        .pixels()
        .iter()
        .filter(|p| (p.red() as u32 + p.green() as u32 + p.blue() as u32) < 600)
        .count();
    let share = inked as f64 / png.pixels().len() as f64;
    assert!(
        share > 0.01,
        "the screenshot is blank ({share:.4} of its pixels inked): {}",
        shot.display()
    );
    println!("screenshot kept: {}", shot.display());
    // The terminal tables print each run id whole: repeats differ in their last characters.
    for id in [
        "002-mnist-cnn-fashion-mnist-b32-strong-b16-r2-rep0",
        "002-mnist-cnn-fashion-mnist-b32-strong-b16-r2-rep2",
    ] {
        assert!(job.stdout.lines().any(|l| l.starts_with(id)), "{id} cut in:\n{}", job.stdout);
    }
}

/// The decision is the first screen: in a 1,400 × 900 window, the recommendation's line
/// (a shape with its epoch, GPU-hours and cost) ends above the window's bottom. The page
/// has no script of its own; a copy of it gets one that measures where that line lies
/// and writes it into the DOM, which Chromium then dumps.
#[test]
fn the_first_screen_shows_what_to_run_with_epoch_gpu_hours_and_cost() {
    let kept = tmp();
    let dir = kept.path().to_path_buf();
    let out = dir.join("report");
    let f = fixtures();
    ddpbench(&[
        "reduce",
        &path_str(&f.join("study/runs")),
        &path_str(&f.join("single")),
        &path_str(&f.join("sweep")),
        "--out",
        &path_str(&out),
        "--link",
        "ib-hdr",
        "--price-per-gpu-hour",
        "2.5",
    ])
    .assert_ok();
    let report = json(&out.join("report.json"));
    let run = report["decisions"][0]["run"][0]
        .as_str()
        .unwrap_or_else(|| panic!("no decision: {report}"));
    for word in ["epoch", "GPU-hours per epoch", "cost "] {
        assert!(run.contains(word), "the recommendation's line lacks {word:?}: {run}");
    }
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    let probe = r#"<script>
window.addEventListener('load', () => {
  const line = [...document.querySelectorAll('li')].find(li =>
    /GPU-hours per epoch/.test(li.textContent) && /cost /.test(li.textContent));
  const r = line ? line.getBoundingClientRect() : null;
  document.body.setAttribute('data-probe',
    r ? `${r.top} ${r.bottom} ${window.innerHeight} ${line.textContent.slice(0, 40)}` : 'none');
});
</script>"#;
    let probed = dir.join("probe.html");
    std::fs::write(&probed, page.replacen("</body>", &format!("{probe}</body>"), 1)).unwrap();
    let (dom, _) = chromium(&dir, &probed, &["--window-size=1400,900", "--dump-dom"]);
    let at = dom.find("data-probe=\"").unwrap_or_else(|| panic!("the probe did not run:\n{dom}")) + 12;
    let probe = &dom[at..at + dom[at..].find('"').unwrap()];
    let fields: Vec<&str> = probe.splitn(4, ' ').collect();
    assert!(fields.len() == 4, "no line with GPU-hours and cost on the page: {probe}");
    let (top, bottom, height): (f64, f64, f64) = (fields[0].parse().unwrap(), fields[1].parse().unwrap(), fields[2].parse().unwrap());
    assert!(
        top >= 0.0 && bottom <= height,
        "the recommendation lies at {top}–{bottom} px, below the first screen ({height} px): {probe}"
    );
    let words: String = run.replace("**", "").chars().take(30).collect();
    assert!(
        fields[3].starts_with(&words[..words.len().min(fields[3].len())]),
        "{probe} is not {run}"
    );
}

#[test]
fn report_page_is_written_without_plots_too() {
    let dir = tmp();
    let f = fixtures();
    let out = dir.path().join("r");
    ddpbench(&["reduce", &path_str(&f.join("single")), "--out", &path_str(&out), "--no-plots"]).assert_ok();
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(page.contains("<svg"), "the page draws its pictures inline even with --no-plots");
    assert!(!out.join("speedup.png").exists());
}

/// times.csv: per run, the epoch's training (summary.csv's epoch_s), the median
/// validation of its epochs, the two added, and the manifest's whole-run wall time;
/// report.md shows them with the 1-rank time by batch.
#[test]
fn times_add_validation_and_the_whole_run() {
    let dir = tmp();
    let f = fixtures();
    let out = dir.path().join("r");
    ddpbench(&["reduce", &path_str(&f.join("single")), "--out", &path_str(&out), "--no-plots"]).assert_ok();
    let (h, rows) = read_csv(&out.join("times.csv"));
    let (sh, srows) = read_csv(&out.join("summary.csv"));
    for run in ["single-1r", "single-2r"] {
        let at = |h: &[String], rows: &[Vec<String>], col: &str| -> f64 {
            let id = h.iter().position(|c| c == "run_id").unwrap();
            let r = rows.iter().find(|r| r[id] == run).unwrap_or_else(|| panic!("no row for {run}"));
            r[h.iter().position(|c| c == col).unwrap_or_else(|| panic!("no column {col}"))]
                .parse()
                .unwrap()
        };
        let (eh, erows) = read_csv(&f.join("single").join(run).join("epochs.csv"));
        let mut vals = col(&eh, &erows, "val_s");
        vals.sort_by(f64::total_cmp);
        let median = if vals.len() % 2 == 1 {
            vals[vals.len() / 2]
        } else {
            (vals[vals.len() / 2 - 1] + vals[vals.len() / 2]) / 2.0
        };
        let wall = json(&f.join("single").join(run).join("manifest.json"))["wall_s"].as_f64().unwrap();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
        assert!(close(at(&h, &rows, "val_s_per_epoch"), median), "{run}: validation");
        assert!(close(at(&h, &rows, "epoch_s"), at(&sh, &srows, "epoch_s")), "{run}: epoch");
        assert!(
            close(at(&h, &rows, "epoch_with_val_s"), at(&h, &rows, "epoch_s") + median),
            "{run}: sum"
        );
        assert!(close(at(&h, &rows, "run_wall_s"), wall), "{run}: wall");
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## Time per epoch and per run"), "{md}");
    assert!(md.contains("## 1-rank time by batch size"), "{md}");
}

/// The speedup grid by batch × ranks starts with the 1-rank step time of each batch:
/// the 1-rank point's `step_s_mean` in scaling.csv, in ms.
#[test]
fn speedup_grid_has_the_1_rank_time() {
    let dir = tmp();
    let out = dir.path().join("r");
    ddpbench(&[
        "reduce",
        &path_str(&fixtures().join("study/runs")),
        "--out",
        &path_str(&out),
        "--no-plots",
    ])
    .assert_ok();
    let (h, rows) = read_csv(&out.join("scaling.csv"));
    let c = |name: &str| h.iter().position(|x| x == name).unwrap();
    let alone = rows
        .iter()
        .find(|r| r[c("ranks")] == "1" && r[c("batch_per_rank")] == "32")
        .expect("a 1-rank point at batch 32");
    let step_ms: f64 = alone[c("step_s_mean")].parse::<f64>().unwrap() * 1e3;
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("| batch/rank | 1-rank step ms |"), "{md}");
    assert!(
        md.contains(&format!("| 32 | {step_ms:.2} |")),
        "no 1-rank time {step_ms:.2} ms for batch 32:\n{md}"
    );
}

/// bandwidth.svg names each batch per rank in its legend, so dots of two batches are
/// never one unlabelled colour; each multi-rank run has its heatmap, labelled by rank.
#[test]
fn plots_name_what_they_show() {
    let dir = tmp();
    let out = dir.path().join("r");
    ddpbench(&["reduce", &path_str(&fixtures().join("study/runs")), "--out", &path_str(&out)]).assert_ok();
    let bw = std::fs::read_to_string(out.join("bandwidth.svg")).unwrap();
    for batch in [16, 32] {
        assert!(
            bw.contains(&format!("inside training, batch {batch}/rank")),
            "batch {batch} not named:\n{bw}"
        );
    }
    let heat = std::fs::read_to_string(out.join("heatmap-001-mnist-cnn-fashion-mnist-b32-r2-rep0.svg")).unwrap();
    let texts: Vec<&str> = heat.lines().map(str::trim).collect();
    for t in ["rank", "global step", "own work ms", "0", "1"] {
        assert!(texts.contains(&t), "no text {t:?} in the heatmap:\n{heat}");
    }
}

/// The reduce of every fixture run (the study's, the two single runs, the sweep).
fn fixture_report() -> ddpbench::reduce::Report {
    let f = fixtures();
    let req = ddpbench::reduce::ReduceRequest {
        runs: vec![f.join("study/runs"), f.join("single"), f.join("sweep")],
        ..Default::default()
    };
    ddpbench::reduce::run(&req).unwrap()
}

/// With its bound lowered under what the whole page takes, report.html stays under it:
/// its largest pictures are binned further or left out, the page says so at its top, the
/// writer returns the same sentences (what `reduce` prints), and each picture left out
/// names its SVG file, which is beside the page.
#[test]
fn report_page_stays_under_a_lowered_bound() {
    use ddpbench::reduce::PageLimits;
    let report = fixture_report();
    let dir = tmp();
    let whole = dir.path().join("whole");
    let notes = ddpbench::reduce::write(&report, &whole, true).unwrap();
    assert!(notes.is_empty(), "the whole page is under 5 MB: {notes:?}");
    let whole_page = std::fs::read_to_string(whole.join("report.html")).unwrap();
    assert!(!whole_page.contains("This page is kept under"));
    let bound = whole_page.len() * 6 / 10;
    let out = dir.path().join("bounded");
    let limits = PageLimits {
        bytes_max: bound,
        ..Default::default()
    };
    let notes = ddpbench::reduce::write_within(&report, &out, true, &limits).unwrap();
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(page.len() <= bound, "{} bytes over the bound {bound}", page.len());
    assert!(!notes.is_empty(), "nothing said about a page cut to {bound} bytes");
    assert!(
        page.contains(&format!("This page is kept under {bound} bytes")),
        "no note on the page"
    );
    for n in &notes {
        let words: String = n.chars().take(50).collect();
        assert!(page.contains(&words), "{n:?} not on the page");
    }
    let left_out: Vec<&str> = notes
        .iter()
        .filter_map(|n| n.split_once(" is left out (it is ")?.1.strip_suffix(" beside this page)"))
        .collect();
    assert!(!left_out.is_empty(), "{notes:?}");
    for file in left_out {
        assert!(out.join(file).is_file(), "{file} named but not beside the page");
        let stem = file.strip_suffix(".svg").unwrap();
        assert!(page.contains(&format!("The picture <code>{stem}</code> is left out here")));
    }
    assert!(page.matches("<svg").count() < whole_page.matches("<svg").count());
}

/// The heatmap's colour for `t` in 0..=1 as the plot draws it: pale yellow to dark red.
fn heat(t: f64) -> [u8; 3] {
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * t).round() as u8;
    [mix(0xff, 0x80), mix(0xf5, 0x00), mix(0xc0, 0x26)]
}

/// A real 2-rank run of more steps than a lowered heatmap limit (1 row, 5 columns),
/// reduced: the page's heatmap has 1 row of both ranks and the binned number of columns
/// (the fewest steps per column, a power of two, that fit 5), and each cell's colour is
/// the one of the largest own work (step_s less comm_exposed_s) of the rank-steps it
/// covers, recomputed here from the rank files.
#[test]
#[cfg_attr(not(feature = "train"), ignore = "trains its run: needs the `train` feature")]
fn the_page_heatmap_bins_a_real_run_as_its_rows_say() {
    use ddpbench::reduce::HeatmapLimits;
    use ddpbench::reduce::PageLimits;
    let d = tmp();
    let run = d.path().join("run");
    let args = [
        "--dataset",
        "synthetic",
        "--synthetic-samples",
        "4096",
        "--max-steps",
        "40",
        "--val-samples",
        "0",
        "--batch-size",
        "8",
        "--threads",
        "1",
        "--out",
        &path_str(&run),
    ];
    train(2, &args, std::time::Duration::from_secs(300)).assert_ok();
    // Own work per counted step, the largest of the two ranks, in ms.
    let mut own: BTreeMap<u64, f64> = BTreeMap::new();
    for rank in 0..2 {
        let (h, rows) = read_csv(&run.join(format!("rank-{rank:05}.csv")));
        let (steps, warm) = (col(&h, &rows, "global_step"), col(&h, &rows, "warmup"));
        let (step_s, exposed) = (col(&h, &rows, "step_s"), col(&h, &rows, "comm_exposed_s"));
        for i in (0..rows.len()).filter(|&i| warm[i] == 0.0) {
            let v = (step_s[i] - exposed[i]).max(0.0) * 1e3;
            let at = own.entry(steps[i] as u64).or_insert(f64::NEG_INFINITY);
            *at = at.max(v);
        }
    }
    let counted: Vec<f64> = own.into_values().collect();
    let columns_max = 5;
    assert!(counted.len() > 2 * columns_max, "{} counted steps", counted.len());
    let mut per_column = 1;
    while counted.len().div_ceil(per_column) > columns_max {
        per_column *= 2;
    }
    let cells: Vec<f64> = counted
        .chunks(per_column)
        .map(|c| c.iter().copied().fold(f64::NEG_INFINITY, f64::max))
        .collect();
    let (lo, hi) = cells
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |a, v| (a.0.min(*v), a.1.max(*v)));

    let req = ddpbench::reduce::ReduceRequest {
        runs: vec![run.clone()],
        ..Default::default()
    };
    let report = ddpbench::reduce::run(&req).unwrap();
    let out = d.path().join("report");
    let limits = PageLimits {
        heatmap: HeatmapLimits {
            rows: 1,
            columns: columns_max,
        },
        ..Default::default()
    };
    ddpbench::reduce::write_within(&report, &out, false, &limits).unwrap();
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    let title = page.find("Own work per rank and step").expect("no heatmap on the page");
    let svg = &page[page[..title].rfind("<svg").unwrap()..];
    let svg = &svg[..svg.find("</svg>").unwrap()];
    assert!(
        svg.contains(&format!("(2 rank(s) × {per_column} step(s) a cell, its largest)")),
        "{svg}"
    );
    // The cells: rects left of the colour bar (the rightmost rects), not the background.
    let rects: Vec<(f64, f64, String)> = svg
        .match_indices("<rect")
        .map(|(i, _)| {
            let tag = &svg[i..i + svg[i..].find('>').unwrap()];
            let num = |n: &str| attr(tag, n).unwrap().parse::<f64>().unwrap();
            (num("x"), num("width"), attr(tag, "fill").unwrap())
        })
        .collect();
    let bar_x = rects.iter().map(|r| r.0).fold(f64::NEG_INFINITY, f64::max);
    let mut drawn: Vec<(f64, String)> = rects.iter().skip(1).filter(|r| r.0 < bar_x).map(|r| (r.0, r.2.clone())).collect();
    drawn.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(drawn.len(), cells.len(), "1 row × {} columns: {drawn:?}", cells.len());
    for ((_, fill), v) in drawn.iter().zip(&cells) {
        let want = heat((v - lo) / (hi - lo).max(1e-12));
        let got: Vec<u8> = (0..3)
            .map(|k| u8::from_str_radix(&fill[1 + 2 * k..3 + 2 * k], 16).unwrap())
            .collect();
        let close = got.iter().zip(want).all(|(g, w)| g.abs_diff(w) <= 1);
        assert!(close, "cell {v} ms drawn {fill}, want {want:02X?} (cells {cells:?})");
    }
}
