//! `updateinfo.xml` bombs and repeated ids, from structure: entries with
//! ids and packages drawn from small sets, packages repeated up to
//! thousands of times (as a bomb repeats them), written as XML and gzipped.
//! The parse must agree with a model: each id once, in first-seen order,
//! with its packages merged in first-seen order without duplicates; within
//! the limits exactly when the model is; never panicking, in linear time.
#![no_main]

use std::io::Write as _;

use arbitrary::Arbitrary;
use elemental_changelog::updateinfo::{self, Error, Limits};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_advisories: 6,
    max_bytes: 64 << 20,
    max_element_bytes: 1 << 20,
    max_packages_per_advisory: 40,
    max_packages: 3000,
    // The memory cap is the unit tests' business here: never reached.
    max_memory: 1 << 40,
    max_duration: std::time::Duration::from_secs(60),
};

#[derive(Arbitrary, Debug)]
struct Entry {
    id: u8,
    packages: Vec<(u8, u16)>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    entries: Vec<Entry>,
    gzip: bool,
}

fuzz_target!(|input: Input| {
    let mut xml = String::from("<updates>");
    // The model: (id, packages) in first-seen order, and packages read.
    let mut model: Vec<(String, Vec<String>)> = Vec::new();
    let mut read = 0usize;
    let mut within = true;
    for entry in input.entries.iter().take(64) {
        let id = format!("ID-{}", entry.id % 8);
        xml.push_str(&format!("<update type=\"security\"><id>{id}</id><pkglist><collection>"));
        let index = match model.iter().position(|(i, _)| *i == id) {
            Some(index) => index,
            None => {
                model.push((id.clone(), Vec::new()));
                model.len() - 1
            }
        };
        let mut own = 0usize;
        for (package, repeat) in entry.packages.iter().take(16) {
            for _ in 0..(*repeat % 2048) {
                let name = format!("p{}", package % 64);
                xml.push_str(&format!(
                    "<package name=\"{name}\" version=\"1\" release=\"1\" arch=\"x86_64\"/>"
                ));
                read += 1;
                own += 1;
                let packages = &mut model[index].1;
                if !packages.contains(&name) {
                    packages.push(name);
                }
            }
        }
        within &= own <= LIMITS.max_packages_per_advisory;
        xml.push_str("</collection></pkglist></update>");
    }
    xml.push_str("</updates>");
    within &= read <= LIMITS.max_packages
        && model.len() <= LIMITS.max_advisories
        && model
            .iter()
            .all(|(_, packages)| packages.len() <= LIMITS.max_packages_per_advisory);
    let bytes = if input.gzip {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(xml.as_bytes()).expect("gzip in memory");
        gz.finish().expect("gzip in memory")
    } else {
        xml.into_bytes()
    };
    let name = if input.gzip { "updateinfo.xml.gz" } else { "updateinfo.xml" };
    let reader = updateinfo::decoder_for(name, &bytes[..]).expect("decoder");
    match updateinfo::parse(reader, LIMITS) {
        Ok(advisories) => {
            assert!(within, "accepted beyond the limits");
            let got: Vec<(String, Vec<String>)> = advisories
                .into_iter()
                .map(|a| (a.id, a.packages.into_iter().map(|p| p.name).collect()))
                .collect();
            assert_eq!(got, model);
        }
        Err(Error::TooManyPackages { .. } | Error::TooManyPackagesInAll { .. } | Error::TooManyAdvisories { .. }) => {
            assert!(!within, "refused within the limits");
        }
        Err(error) => panic!("unexpected error {error}"),
    }
});
