//! SUSE repodata `updateinfo.xml`: every advisory of a repository with the
//! package EVRs that ship it. Parsed streaming, with [`Limits`] on what a
//! hostile file could make the parser spend: bytes read, the size of one
//! element, advisories, packages per advisory and in all, the memory the
//! parsed advisories take (estimated as they are built), and time. An id
//! listed twice is merged in linear time.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, BufRead, BufReader, Read};
use std::time::{Duration, Instant};

use elemental_changelog_apiservice::types::{Advisory, AdvisoryPackage, Reference, Severity};
use quick_xml::events::{BytesRef, BytesStart, Event};

use crate::updates::{self, normalize_epoch, parse_issued_str, with_cves_and_bugs};

/// File names an `updateinfo` may have in `/changelogs/`.
pub const FILE_NAMES: [&str; 3] = ["updateinfo.xml", "updateinfo.xml.gz", "updateinfo.xml.zst"];

/// Why an `updateinfo.xml` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stream could not be read (or decompressed).
    #[error("cannot read the stream")]
    Io(#[source] io::Error),
    /// The XML is malformed.
    #[error("malformed XML at byte {position}")]
    Xml {
        /// Byte offset (in the decompressed stream) where the error was found.
        position: u64,
        /// The parser's error.
        #[source]
        source: quick_xml::Error,
    },
    /// A malformed attribute.
    #[error("malformed attribute at byte {position}")]
    Attribute {
        /// Byte offset of the element.
        position: u64,
        /// The parser's error.
        #[source]
        source: quick_xml::events::attributes::AttrError,
    },
    /// More than [`Limits::max_bytes`] of (decompressed) XML.
    #[error("updateinfo is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// More than [`Limits::max_advisories`] advisories.
    #[error("updateinfo has more than the limit of {limit} advisories")]
    TooManyAdvisories {
        /// The limit.
        limit: usize,
    },
    /// One element (a start tag or a run of text) larger than
    /// [`Limits::max_element_bytes`].
    #[error("an element is larger than the limit of {limit} bytes")]
    ElementTooLarge {
        /// The limit.
        limit: u64,
    },
    /// An advisory lists more than [`Limits::max_packages_per_advisory`]
    /// packages (its repeated entries together).
    #[error("advisory {id} has more than the limit of {limit} packages")]
    TooManyPackages {
        /// Advisory id.
        id: String,
        /// The limit.
        limit: usize,
    },
    /// More than [`Limits::max_packages`] packages read over all advisories.
    #[error("updateinfo has more than the limit of {limit} packages")]
    TooManyPackagesInAll {
        /// The limit.
        limit: usize,
    },
    /// The parsed advisories would take more than [`Limits::max_memory`].
    #[error("the parsed updateinfo would take more than the limit of {limit} bytes of memory")]
    TooMuchMemory {
        /// The limit.
        limit: u64,
    },
    /// Parsing took longer than [`Limits::max_duration`].
    #[error("parsing took longer than the limit of {limit:?}")]
    TooSlow {
        /// The limit.
        limit: Duration,
    },
    /// An `<update>` without an `<id>`.
    #[error("update {index} has no id")]
    MissingId {
        /// Position of the `<update>` (from 0).
        index: usize,
    },
    /// An `<issued date>` that is not a time.
    #[error("update {id} has an invalid issued date {value:?}")]
    Date {
        /// Advisory id.
        id: String,
        /// The value as written.
        value: String,
    },
    /// The document ended inside an element.
    #[error("unexpected end of document")]
    Truncated,
}

/// Largest zstd window an `updateinfo.xml.zst` may ask for (2^23 = 8 MiB,
/// what levels up to 19 use): frames that ask for more are refused instead
/// of allocating it.
pub const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// Limits applied while parsing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most advisories accepted.
    pub max_advisories: usize,
    /// Most bytes read from the (decompressed) stream.
    pub max_bytes: u64,
    /// Largest element: a start tag with its attributes, or a run of text.
    pub max_element_bytes: u64,
    /// Most packages in one advisory (its repeated entries merged).
    pub max_packages_per_advisory: usize,
    /// Most `<package>` elements read over all advisories (repeated
    /// entries included).
    pub max_packages: usize,
    /// Most memory the parsed advisories may take, as estimated while they
    /// are built (structures and the text they hold).
    pub max_memory: u64,
    /// Longest the parse may take.
    pub max_duration: Duration,
}

impl Default for Limits {
    /// 100 000 advisories, 512 MiB of XML, 1 MiB elements, 20 000 packages
    /// per advisory and 1 000 000 in all, 256 MiB of parsed advisories,
    /// 30 s: several times the largest SUSE repository's updateinfo.
    fn default() -> Self {
        Self {
            max_advisories: 100_000,
            max_bytes: 512 << 20,
            max_element_bytes: 1 << 20,
            max_packages_per_advisory: 20_000,
            max_packages: 1_000_000,
            max_memory: 256 << 20,
            max_duration: Duration::from_secs(30),
        }
    }
}

/// Estimated cost of one package in the index that merges a repeated id:
/// a hash, an index and a vector.
const MERGE_ENTRY_COST: u64 = 48;

fn package_cost(p: &AdvisoryPackage) -> u64 {
    (std::mem::size_of::<AdvisoryPackage>()
        + p.name.len()
        + p.epoch.as_ref().map_or(0, String::len)
        + p.version.len()
        + p.release.len()
        + p.arch.len()) as u64
}

fn reference_cost(r: &Reference) -> u64 {
    (std::mem::size_of::<Reference>() + r.id.len() + r.type_.len() + r.href.len() + r.title.len())
        as u64
}

/// A reader that fails once more than `limit` bytes went through it, or more
/// than `element_limit` since the parser last took an event (so one element
/// cannot grow the parser's buffer past it).
struct Counting<R> {
    inner: R,
    read: u64,
    limit: u64,
    exceeded: bool,
    since_event: u64,
    element_limit: u64,
    element_exceeded: bool,
}

impl<R: BufRead> Read for Counting<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = available.len().min(out.len());
        out[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Counting<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        let remaining = self.limit.saturating_sub(self.read);
        let buf = self.inner.fill_buf()?;
        if buf.is_empty() {
            return Ok(buf);
        }
        if remaining == 0 {
            self.exceeded = true;
            return Err(io::Error::other("size limit reached"));
        }
        let element_remaining = self.element_limit.saturating_sub(self.since_event);
        if element_remaining == 0 {
            self.element_exceeded = true;
            return Err(io::Error::other("element size limit reached"));
        }
        let n = usize::try_from(remaining.min(element_remaining))
            .map_or(buf.len(), |r| r.min(buf.len()));
        Ok(&buf[..n])
    }

    fn consume(&mut self, amt: usize) {
        self.read += amt as u64;
        self.since_event += amt as u64;
        self.inner.consume(amt);
    }
}

/// A reader of the decompressed content of the file at `path`: gzip for
/// `.gz`, zstd for `.zst`, as is otherwise.
pub fn decoder_for<'a, R: Read + 'a>(
    path: &str,
    reader: R,
) -> Result<Box<dyn BufRead + 'a>, Error> {
    Ok(if path.ends_with(".gz") {
        Box::new(BufReader::new(flate2::read::MultiGzDecoder::new(reader)))
    } else if path.ends_with(".zst") {
        let mut decoder = zstd::stream::read::Decoder::new(reader).map_err(Error::Io)?;
        decoder
            .window_log_max(ZSTD_WINDOW_LOG_MAX)
            .map_err(Error::Io)?;
        Box::new(BufReader::new(decoder))
    } else {
        Box::new(BufReader::new(reader))
    })
}

/// A text element of an `<update>`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Id,
    Title,
    Severity,
    Description,
}

impl Field {
    const ALL: [Field; 4] = [Field::Id, Field::Title, Field::Severity, Field::Description];

    /// Its element name.
    fn tag(self) -> &'static [u8] {
        match self {
            Field::Id => b"id",
            Field::Title => b"title",
            Field::Severity => b"severity",
            Field::Description => b"description",
        }
    }

    /// Where its text goes.
    fn slot(self, b: &mut Builder) -> &mut String {
        match self {
            Field::Id => &mut b.id,
            Field::Title => &mut b.title,
            Field::Severity => &mut b.severity,
            Field::Description => &mut b.description,
        }
    }
}

#[derive(Default)]
struct Builder {
    type_: String,
    id: String,
    title: String,
    severity: String,
    issued: Option<String>,
    references: Vec<Reference>,
    description: String,
    packages: Vec<AdvisoryPackage>,
}

/// What a parse has read so far.
#[derive(Default)]
struct State {
    /// Advisories, in file order.
    advisories: Vec<Advisory>,
    /// Their positions by id.
    by_id: HashMap<String, usize>,
    /// The `<update>` being read.
    current: Option<Builder>,
    /// The text element of `current` being read, and its text so far.
    field: Option<Field>,
    text: String,
    /// `<update>` elements finished.
    updates_seen: usize,
}

fn reference_from(mut attributes: HashMap<Vec<u8>, String>) -> Reference {
    let mut take = |k: &[u8]| attributes.remove(k).unwrap_or_default();
    Reference {
        id: take(b"id"),
        type_: take(b"type"),
        href: take(b"href"),
        title: take(b"title"),
    }
}

fn package_from(mut attributes: HashMap<Vec<u8>, String>) -> AdvisoryPackage {
    let epoch = attributes
        .get(b"epoch".as_slice())
        .and_then(|e| normalize_epoch(e));
    let mut take = |k: &[u8]| attributes.remove(k).unwrap_or_default();
    AdvisoryPackage {
        name: take(b"name"),
        epoch,
        version: take(b"version"),
        release: take(b"release"),
        arch: take(b"arch"),
    }
}

/// Events between two looks at the clock.
const EVENTS_PER_CLOCK_CHECK: u32 = 1024;

struct Parser<R> {
    reader: quick_xml::Reader<Counting<R>>,
    limits: Limits,
    /// Events read, for the clock checks.
    events: u32,
    /// Estimated memory of what was parsed so far.
    memory: u64,
    packages: usize,
    deadline: Instant,
    /// Per merged advisory (by index): its packages by hash, to merge a
    /// repeated id in linear time.
    merged: HashMap<usize, HashMap<u64, Vec<usize>>>,
    hasher: RandomState,
}

impl<R: BufRead> Parser<R> {
    fn position(&self) -> u64 {
        self.reader.buffer_position()
    }

    fn xml_error(&self, source: quick_xml::Error) -> Error {
        if self.reader.get_ref().exceeded {
            return Error::TooLarge {
                limit: self.limits.max_bytes,
            };
        }
        if self.reader.get_ref().element_exceeded {
            return Error::ElementTooLarge {
                limit: self.limits.max_element_bytes,
            };
        }
        match source {
            quick_xml::Error::Io(e) => Error::Io(io::Error::new(e.kind(), e.to_string())),
            source => Error::Xml {
                position: self.position(),
                source,
            },
        }
    }

    fn attributes(&self, e: &BytesStart<'_>) -> Result<HashMap<Vec<u8>, String>, Error> {
        let mut out = HashMap::new();
        for attr in e.attributes() {
            let attr = attr.map_err(|source| Error::Attribute {
                position: self.position(),
                source,
            })?;
            let value = attr
                .unescape_value()
                .map_err(|source| self.xml_error(source))?;
            out.insert(attr.key.local_name().as_ref().to_vec(), value.into_owned());
        }
        Ok(out)
    }

    /// Counts `bytes` more of parsed data against [`Limits::max_memory`].
    fn charge(&mut self, bytes: u64) -> Result<(), Error> {
        self.memory = self.memory.saturating_add(bytes);
        if self.memory > self.limits.max_memory {
            return Err(Error::TooMuchMemory {
                limit: self.limits.max_memory,
            });
        }
        Ok(())
    }

    /// Counts one package more against the package limits.
    fn count_package(&mut self, id: &str, in_advisory: usize) -> Result<(), Error> {
        if in_advisory > self.limits.max_packages_per_advisory {
            return Err(Error::TooManyPackages {
                id: id.to_owned(),
                limit: self.limits.max_packages_per_advisory,
            });
        }
        self.packages += 1;
        if self.packages > self.limits.max_packages {
            return Err(Error::TooManyPackagesInAll {
                limit: self.limits.max_packages,
            });
        }
        Ok(())
    }

    fn parse(mut self) -> Result<Vec<Advisory>, Error> {
        let mut buf = Vec::new();
        let mut state = State::default();
        loop {
            match self.next_event(&mut buf)? {
                Event::Start(ref e) => self.start(&mut state, e, false)?,
                Event::Empty(ref e) => self.start(&mut state, e, true)?,
                Event::Text(ref t) if state.field.is_some() => {
                    let s = t.xml_content().map_err(|e| self.xml_error(e.into()))?;
                    self.push_text(&mut state.text, &s)?;
                }
                Event::CData(ref t) if state.field.is_some() => {
                    let s = t.decode().map_err(|e| self.xml_error(e.into()))?;
                    self.push_text(&mut state.text, &s)?;
                }
                Event::GeneralRef(ref r) if state.field.is_some() => {
                    self.push_reference(&mut state.text, r)?;
                }
                Event::End(ref e) => self.end(&mut state, e.local_name().as_ref())?,
                Event::Eof if state.current.is_some() => return Err(Error::Truncated),
                Event::Eof => return Ok(state.advisories),
                _ => {}
            }
        }
    }

    /// The next event, within the time and element-size limits.
    fn next_event<'b>(&mut self, buf: &'b mut Vec<u8>) -> Result<Event<'b>, Error> {
        buf.clear();
        self.events = self.events.wrapping_add(1);
        if self.events.is_multiple_of(EVENTS_PER_CLOCK_CHECK) && Instant::now() > self.deadline {
            return Err(Error::TooSlow {
                limit: self.limits.max_duration,
            });
        }
        if buf.capacity() as u64 > self.limits.max_element_bytes.saturating_mul(2) {
            *buf = Vec::new();
        }
        self.reader.get_mut().since_event = 0;
        self.reader
            .read_event_into(buf)
            .map_err(|e| self.xml_error(e))
    }

    /// A start (or empty) tag: an `<update>`, or an element inside one.
    fn start(&mut self, state: &mut State, e: &BytesStart<'_>, empty: bool) -> Result<(), Error> {
        let name = e.local_name();
        let Some(b) = state.current.as_mut() else {
            if name.as_ref() == b"update" {
                let mut attrs = self.attributes(e)?;
                if empty {
                    return Err(Error::MissingId {
                        index: state.updates_seen,
                    });
                }
                state.current = Some(Builder {
                    type_: attrs.remove(b"type".as_slice()).unwrap_or_default(),
                    ..Builder::default()
                });
            }
            return Ok(());
        };
        if let Some(field) = Field::ALL.into_iter().find(|f| f.tag() == name.as_ref()) {
            if !empty {
                state.field = Some(field);
                state.text.clear();
            }
            return Ok(());
        }
        match name.as_ref() {
            b"issued" => b.issued = self.attributes(e)?.remove(b"date".as_slice()),
            b"reference" => {
                let reference = reference_from(self.attributes(e)?);
                // Also the CVE and bug ids derived from it.
                self.charge(2 * reference_cost(&reference))?;
                b.references.push(reference);
            }
            b"package" => {
                let package = package_from(self.attributes(e)?);
                self.count_package(&b.id, b.packages.len() + 1)?;
                self.charge(package_cost(&package))?;
                b.packages.push(package);
            }
            _ => {}
        }
        Ok(())
    }

    /// Text of the element being read.
    fn push_text(&mut self, text: &mut String, s: &str) -> Result<(), Error> {
        self.charge(s.len() as u64)?;
        text.push_str(s);
        Ok(())
    }

    /// A character or entity reference in the element being read; an
    /// unknown entity is kept as written.
    fn push_reference(&mut self, text: &mut String, r: &BytesRef<'_>) -> Result<(), Error> {
        self.charge(8)?;
        if let Some(c) = r.resolve_char_ref().map_err(|e| self.xml_error(e))? {
            text.push(c);
            return Ok(());
        }
        let name = r.decode().map_err(|e| self.xml_error(e.into()))?;
        match quick_xml::escape::resolve_predefined_entity(&name) {
            Some(s) => text.push_str(s),
            None => {
                text.push('&');
                text.push_str(&name);
                text.push(';');
            }
        }
        Ok(())
    }

    /// An end tag: a text element's value is stored, an `<update>` becomes
    /// an advisory.
    fn end(&mut self, state: &mut State, name: &[u8]) -> Result<(), Error> {
        if let (Some(field), Some(b)) = (state.field, state.current.as_mut())
            && name == field.tag()
        {
            *field.slot(b) = std::mem::take(&mut state.text);
            state.field = None;
        }
        if name == b"update"
            && let Some(b) = state.current.take()
        {
            state.field = None;
            let index = state.updates_seen;
            state.updates_seen += 1;
            self.finish(b, index, &mut state.advisories, &mut state.by_id)?;
        }
        Ok(())
    }

    fn hash_of(&self, p: &AdvisoryPackage) -> u64 {
        self.hasher
            .hash_one((&p.name, &p.epoch, &p.version, &p.release, &p.arch))
    }

    fn finish(
        &mut self,
        b: Builder,
        index: usize,
        advisories: &mut Vec<Advisory>,
        by_id: &mut HashMap<String, usize>,
    ) -> Result<(), Error> {
        let id = b.id.trim().to_owned();
        if id.is_empty() {
            return Err(Error::MissingId { index });
        }
        // An id listed twice (one entry per product or architecture) is one
        // advisory shipping the packages of both; packages already there are
        // found by hash.
        if let Some(&i) = by_id.get(&id) {
            let mut merged = self.merged.remove(&i).unwrap_or_default();
            if merged.is_empty() {
                self.charge(MERGE_ENTRY_COST * advisories[i].packages.len() as u64)?;
                for (k, p) in advisories[i].packages.iter().enumerate() {
                    merged.entry(self.hash_of(p)).or_default().push(k);
                }
            }
            let result = self.merge(&mut advisories[i], &mut merged, b.packages);
            self.merged.insert(i, merged);
            return result;
        }
        self.charge(
            (std::mem::size_of::<Advisory>() + id.len() + b.type_.len() + b.severity.len()) as u64,
        )?;
        if advisories.len() >= self.limits.max_advisories {
            return Err(Error::TooManyAdvisories {
                limit: self.limits.max_advisories,
            });
        }
        let issued = match b.issued.as_deref() {
            None => None,
            Some(value) => parse_issued_str(value).map_err(|()| Error::Date {
                id: id.clone(),
                value: value.to_owned(),
            })?,
        };
        let mut advisory = Advisory {
            id,
            type_: b.type_,
            severity: Severity::parse(&b.severity),
            title: b.title.trim().to_owned(),
            issued,
            cves: Vec::new(),
            bugs: Vec::new(),
            references: b.references,
            description: b.description,
            packages: Vec::new(),
        };
        // A package listed twice in one entry is listed once.
        self.merge(&mut advisory, &mut HashMap::new(), b.packages)?;
        by_id.insert(advisory.id.clone(), advisories.len());
        advisories.push(with_cves_and_bugs(advisory));
        Ok(())
    }
}

impl<R: BufRead> Parser<R> {
    /// Adds the packages of an entry that the advisory does not have yet
    /// (`merged`: the advisory's packages by hash).
    fn merge(
        &mut self,
        existing: &mut Advisory,
        merged: &mut HashMap<u64, Vec<usize>>,
        packages: Vec<AdvisoryPackage>,
    ) -> Result<(), Error> {
        for p in packages {
            let hash = self.hash_of(&p);
            let slots = merged.entry(hash).or_default();
            if slots.iter().any(|&k| existing.packages[k] == p) {
                continue;
            }
            if existing.packages.len() >= self.limits.max_packages_per_advisory {
                return Err(Error::TooManyPackages {
                    id: existing.id.clone(),
                    limit: self.limits.max_packages_per_advisory,
                });
            }
            slots.push(existing.packages.len());
            self.charge(MERGE_ENTRY_COST)?;
            existing.packages.push(p);
        }
        Ok(())
    }
}

/// Parses a decompressed `updateinfo.xml` stream (see [`decoder_for`]).
/// Advisories are returned in file order; an id listed twice is merged
/// into one advisory, and a package listed twice in one advisory is kept
/// once.
pub fn parse(reader: impl BufRead, limits: Limits) -> Result<Vec<Advisory>, Error> {
    let counting = Counting {
        inner: reader,
        read: 0,
        limit: limits.max_bytes,
        exceeded: false,
        since_event: 0,
        element_limit: limits.max_element_bytes,
        element_exceeded: false,
    };
    let mut reader = quick_xml::Reader::from_reader(counting);
    reader.config_mut().check_end_names = true;
    Parser {
        reader,
        limits,
        events: 0,
        memory: 0,
        packages: 0,
        deadline: Instant::now() + limits.max_duration,
        merged: HashMap::new(),
        hasher: RandomState::new(),
    }
    .parse()
    .map(|mut advisories| {
        // Kept for as long as the image is served: without the room they were grown with.
        advisories.shrink_to_fit();
        advisories.iter_mut().for_each(updates::compact);
        advisories
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Write;

    const SAMPLE: &[u8] = include_bytes!("../tests/fixtures/updateinfo-sample.xml");
    const EXAMPLE_LOG: &[u8] = include_bytes!("../tests/fixtures/example.updates.log.json");

    #[test]
    fn parses_the_sample() {
        let advisories = parse(SAMPLE, Limits::default()).unwrap();
        assert_eq!(advisories.len(), 2);
        let sec = &advisories[1];
        assert_eq!(sec.id, "Security-Update-ID");
        assert_eq!(sec.type_, "security");
        assert_eq!(sec.severity, Severity::Important);
        assert_eq!(
            sec.issued.map(|t| t.to_string()).as_deref(),
            Some("2024-08-20T11:47:06Z")
        );
        assert_eq!(sec.cves, ["CVE-2024-00002"]);
        assert_eq!(sec.bugs, ["0000002"]);
        assert_eq!(
            sec.packages,
            [AdvisoryPackage {
                name: "elemental-register".into(),
                epoch: None,
                version: "1.52.0".into(),
                release: "5.1".into(),
                arch: "x86_64".into(),
            }]
        );
    }

    #[test]
    fn agrees_with_the_updates_log_of_the_same_advisories() {
        let from_xml = parse(SAMPLE, Limits::default()).unwrap();
        let from_json = crate::updates::parse(EXAMPLE_LOG).unwrap();
        assert_eq!(from_xml, from_json);
    }

    #[test]
    fn entities_cdata_epochs_and_merging() {
        let xml = br#"<?xml version="1.0"?><updates>
          <update type="security"><id>A</id><title>a &amp; b &#x41;</title><severity>low</severity>
            <issued date="2024-01-02 03:04:05"/><description><![CDATA[<raw>]]></description>
            <pkglist><collection><package name="p" epoch="2" version="1" release="1" arch="noarch"/></collection></pkglist></update>
          <update type="security"><id>A</id><pkglist><collection><package name="q" epoch="0" version="1" release="1" arch="x86_64"/></collection></pkglist></update>
        </updates>"#;
        let advisories = parse(&xml[..], Limits::default()).unwrap();
        assert_eq!(advisories.len(), 1);
        let a = &advisories[0];
        assert_eq!(a.title, "a & b A");
        assert_eq!(a.description, "<raw>");
        assert_eq!(
            a.issued.map(|t| t.to_string()).as_deref(),
            Some("2024-01-02T03:04:05Z")
        );
        assert_eq!(a.packages.len(), 2);
        assert_eq!(a.packages[0].epoch.as_deref(), Some("2"));
        assert_eq!(a.packages[1].epoch, None);
    }

    #[test]
    fn limits_and_errors() {
        let err = parse(
            SAMPLE,
            Limits {
                max_advisories: 1,
                ..Limits::default()
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::TooManyAdvisories { limit: 1 }),
            "{err}"
        );
        let err = parse(
            SAMPLE,
            Limits {
                max_bytes: 100,
                ..Limits::default()
            },
        )
        .unwrap_err();
        assert!(matches!(err, Error::TooLarge { limit: 100 }), "{err}");
        let exact = Limits {
            max_bytes: SAMPLE.len() as u64,
            ..Limits::default()
        };
        assert_eq!(parse(SAMPLE, exact).unwrap().len(), 2);
        assert!(matches!(
            parse(
                &b"<updates><update><title>x</title></update></updates>"[..],
                Limits::default()
            )
            .unwrap_err(),
            Error::MissingId { index: 0 }
        ));
        assert!(matches!(
            parse(&b"<updates><update><id>x</id>"[..], Limits::default()).unwrap_err(),
            Error::Truncated
        ));
        assert!(matches!(
            parse(
                &b"<updates><update><id>x</id></updat></updates>"[..],
                Limits::default()
            )
            .unwrap_err(),
            Error::Xml { .. }
        ));
        assert!(matches!(
            parse(
                &b"<updates><update><id>x</id><issued date=\"later\"/></update></updates>"[..],
                Limits::default()
            )
            .unwrap_err(),
            Error::Date { .. }
        ));
    }

    #[test]
    fn decoders_by_file_name() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(SAMPLE).unwrap();
        let gz = gz.finish().unwrap();
        let zst = zstd::encode_all(SAMPLE, 3).unwrap();
        for (name, bytes) in [
            ("updateinfo.xml", SAMPLE.to_vec()),
            ("updateinfo.xml.gz", gz),
            ("changelogs/updateinfo.xml.zst", zst),
        ] {
            let reader = decoder_for(name, &bytes[..]).unwrap();
            assert_eq!(parse(reader, Limits::default()).unwrap().len(), 2, "{name}");
        }
        let reader = decoder_for("updateinfo.xml.gz", &b"not gzip"[..]).unwrap();
        assert!(matches!(
            parse(reader, Limits::default()).unwrap_err(),
            Error::Io(_)
        ));
    }

    #[test]
    fn decompression_bomb_stops_at_the_limit() {
        let bomb = zstd::encode_all(std::io::repeat(b' ').take(64 << 20), 19).unwrap();
        assert!(bomb.len() < 1 << 20);
        let reader = decoder_for("updateinfo.xml.zst", &bomb[..]).unwrap();
        let err = parse(
            reader,
            Limits {
                max_bytes: 1 << 20,
                ..Limits::default()
            },
        )
        .unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    }

    /// `count` `<package/>` elements, all different, in one `<update>`.
    fn packages_xml(id: &str, count: usize) -> String {
        let mut xml = format!("<update type=\"security\"><id>{id}</id><pkglist><collection>");
        for i in 0..count {
            xml.push_str(&format!(
                "<package name=\"p{i}\" version=\"1\" release=\"1\" arch=\"x86_64\"/>"
            ));
        }
        xml.push_str("</collection></pkglist></update>");
        xml
    }

    /// The bomb of the issue: about 1 MiB of gzip that inflates to hundreds
    /// of MiB of `<package/>` elements in one advisory. Refused at the
    /// package limit after reading a small part of it, in bounded time.
    #[test]
    fn package_bomb_is_refused_early() {
        let element = b"<package name=\"kernel-default\" epoch=\"0\" version=\"6.4.0\" release=\"150600.23.1\" arch=\"x86_64\"/>";
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(b"<updates><update type=\"security\"><id>BOMB</id><pkglist><collection>")
            .unwrap();
        let chunk = element.repeat(10_000);
        let mut inflated = 0u64;
        while inflated < 400 << 20 {
            gz.write_all(&chunk).unwrap();
            inflated += chunk.len() as u64;
        }
        let bomb = gz.finish().unwrap();
        assert!(bomb.len() < 2 << 20, "{} bytes", bomb.len());
        let started = Instant::now();
        let reader = decoder_for("updateinfo.xml.gz", &bomb[..]).unwrap();
        let err = parse(reader, Limits::default()).unwrap_err();
        assert!(
            matches!(err, Error::TooManyPackages { ref id, limit: 20_000 } if id == "BOMB"),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn package_and_memory_limits() {
        let xml = format!(
            "<updates>{}{}</updates>",
            packages_xml("A", 30),
            packages_xml("B", 30)
        );
        let limits = Limits {
            max_packages_per_advisory: 30,
            ..Limits::default()
        };
        assert_eq!(parse(xml.as_bytes(), limits).unwrap().len(), 2);
        let err = parse(
            xml.as_bytes(),
            Limits {
                max_packages_per_advisory: 29,
                ..limits
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::TooManyPackages { limit: 29, .. }),
            "{err}"
        );
        let err = parse(
            xml.as_bytes(),
            Limits {
                max_packages: 59,
                ..limits
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::TooManyPackagesInAll { limit: 59 }),
            "{err}"
        );
        // Every package costs more than its struct.
        let small = (59 * std::mem::size_of::<AdvisoryPackage>()) as u64;
        let err = parse(
            xml.as_bytes(),
            Limits {
                max_memory: small,
                ..limits
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::TooMuchMemory { limit } if limit == small),
            "{err}"
        );
        repeated_packages_merge_and_long_text_is_refused(limits);
    }

    /// Of [`package_and_memory_limits`], with its `limits`.
    fn repeated_packages_merge_and_long_text_is_refused(limits: Limits) {
        // A repeated id's packages are merged (and counted as read).
        let repeated = format!(
            "<updates>{}{}</updates>",
            packages_xml("A", 30),
            packages_xml("A", 30)
        );
        let merged = parse(
            repeated.as_bytes(),
            Limits {
                max_packages: 60,
                ..limits
            },
        )
        .unwrap();
        assert_eq!(merged[0].packages.len(), 30);
        // So are the packages listed twice in one entry.
        let twice = r#"<updates><update><id>T</id><pkglist><collection>
            <package name="a" version="1" release="1" arch="x86_64"/>
            <package name="a" version="1" release="1" arch="x86_64"/>
            <package name="a" version="1" release="2" arch="x86_64"/>
            </collection></pkglist></update></updates>"#;
        let once = parse(twice.as_bytes(), limits).unwrap();
        assert_eq!(once[0].packages.len(), 2);
        // A huge description is refused as it is read.
        let long = format!(
            "<updates><update><id>X</id><description>{}</description></update></updates>",
            "x".repeat(4096)
        );
        let err = parse(
            long.as_bytes(),
            Limits {
                max_memory: 1024,
                ..limits
            },
        )
        .unwrap_err();
        assert!(matches!(err, Error::TooMuchMemory { .. }), "{err}");
        let err = parse(
            long.as_bytes(),
            Limits {
                max_element_bytes: 1024,
                ..limits
            },
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::ElementTooLarge { limit: 1024 }),
            "{err}"
        );
    }

    /// 20 000 entries, each with the same 5 packages and one of its own.
    fn entries_xml(same_id: bool) -> String {
        let mut xml = String::from("<updates>");
        for i in 0..20_000 {
            let id = if same_id {
                "SAME".to_owned()
            } else {
                format!("ID{i}")
            };
            xml.push_str(&format!(
                "<update type=\"security\"><id>{id}</id><pkglist><collection>"
            ));
            for j in 0..5 {
                xml.push_str(&format!(
                    "<package name=\"p{j}\" version=\"1\" release=\"1\" arch=\"x86_64\"/>"
                ));
            }
            xml.push_str(&format!(
                "<package name=\"own{i}\" version=\"1\" release=\"1\" arch=\"x86_64\"/>"
            ));
            xml.push_str("</collection></pkglist></update>");
        }
        xml.push_str("</updates>");
        xml
    }

    /// One id repeated 20 000 times is merged about as fast as 20 000
    /// distinct ids are read (the quadratic `contains` this replaced made
    /// 10^9 comparisons of it).
    #[test]
    fn repeated_ids_merge_in_linear_time() {
        let limits = Limits {
            max_packages_per_advisory: 100_000,
            ..Limits::default()
        };
        let distinct = entries_xml(false);
        let started = Instant::now();
        assert_eq!(parse(distinct.as_bytes(), limits).unwrap().len(), 20_000);
        let reading = started.elapsed();
        let repeated = entries_xml(true);
        let started = Instant::now();
        let advisories = parse(repeated.as_bytes(), limits).unwrap();
        let merging = started.elapsed();
        assert!(
            merging < reading * 2,
            "merging {merging:?}, reading {reading:?}"
        );
        assert_eq!(advisories.len(), 1);
        let packages = &advisories[0].packages;
        assert_eq!(packages.len(), 20_005);
        assert_eq!(packages[0].name, "p0");
        assert_eq!(packages[5].name, "own0");
        assert_eq!(packages[20_004].name, "own19999");
    }

    #[test]
    fn parse_time_is_bounded() {
        let xml = format!("<updates>{}</updates>", packages_xml("A", 3000));
        let err = parse(
            xml.as_bytes(),
            Limits {
                max_duration: Duration::ZERO,
                ..Limits::default()
            },
        )
        .unwrap_err();
        assert!(matches!(err, Error::TooSlow { .. }), "{err}");
    }

    #[test]
    fn zstd_frames_asking_for_a_large_window_are_refused() {
        let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
        encoder.window_log(ZSTD_WINDOW_LOG_MAX + 2).unwrap();
        encoder.write_all(SAMPLE).unwrap();
        let zst = encoder.finish().unwrap();
        let reader = decoder_for("updateinfo.xml.zst", &zst[..]).unwrap();
        assert!(matches!(
            parse(reader, Limits::default()).unwrap_err(),
            Error::Io(_)
        ));
        let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
        encoder.window_log(ZSTD_WINDOW_LOG_MAX).unwrap();
        encoder.write_all(SAMPLE).unwrap();
        let zst = encoder.finish().unwrap();
        let reader = decoder_for("updateinfo.xml.zst", &zst[..]).unwrap();
        assert_eq!(parse(reader, Limits::default()).unwrap().len(), 2);
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&bytes[..], Limits::default());
        }

        #[test]
        fn never_panics_on_xml_shaped_input(s in r#"<updates>(<update type="[a-z]{0,3}">(<id>[a-z&;#0-9]{0,4}</id>|<issued date="[0-9a-z -]{0,12}"/>|<package name="a" epoch="[0-9]{0,2}"/>|<reference id="CVE-[0-9-]{0,12}" type="cve"/>|</?[a-z]{1,3}>){0,6}</update>){0,3}(</updates>)?"#) {
            let _ = parse(s.as_bytes(), Limits { max_advisories: 2, max_bytes: 300, ..Limits::default() });
        }
    }
}
