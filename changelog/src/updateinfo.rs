//! SUSE repodata `updateinfo.xml`: every advisory of a repository with the
//! package EVRs that ship it. Parsed streaming, with limits on the number of
//! advisories and on the bytes read, so a hostile file cannot exhaust
//! memory.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read};

use elemental_changelog_apiservice::types::{Advisory, AdvisoryPackage, Reference, Severity};
use quick_xml::events::{BytesStart, Event};

use crate::updates::{normalize_epoch, parse_issued_str, with_cves_and_bugs};

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

/// Limits applied while parsing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most advisories accepted.
    pub max_advisories: usize,
    /// Most bytes read from the (decompressed) stream.
    pub max_bytes: u64,
}

impl Default for Limits {
    /// 100 000 advisories, 512 MiB: several times the largest SUSE
    /// repository's updateinfo.
    fn default() -> Self {
        Self {
            max_advisories: 100_000,
            max_bytes: 512 << 20,
        }
    }
}

/// A reader that fails once more than `limit` bytes went through it.
struct Counting<R> {
    inner: R,
    read: u64,
    limit: u64,
    exceeded: bool,
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
        let n = usize::try_from(remaining).map_or(buf.len(), |r| r.min(buf.len()));
        Ok(&buf[..n])
    }

    fn consume(&mut self, amt: usize) {
        self.read += amt as u64;
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
        Box::new(BufReader::new(
            zstd::stream::read::Decoder::new(reader).map_err(Error::Io)?,
        ))
    } else {
        Box::new(BufReader::new(reader))
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Id,
    Title,
    Severity,
    Description,
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

struct Parser<R> {
    reader: quick_xml::Reader<Counting<R>>,
    limits: Limits,
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

    fn parse(mut self) -> Result<Vec<Advisory>, Error> {
        let mut buf = Vec::new();
        let mut advisories: Vec<Advisory> = Vec::new();
        let mut by_id: HashMap<String, usize> = HashMap::new();
        let mut current: Option<Builder> = None;
        let mut field: Option<Field> = None;
        let mut text = String::new();
        let mut updates_seen = 0usize;
        loop {
            buf.clear();
            let event = self
                .reader
                .read_event_into(&mut buf)
                .map_err(|e| self.xml_error(e))?;
            match event {
                Event::Start(ref e) | Event::Empty(ref e) => {
                    let empty = matches!(event, Event::Empty(_));
                    match (e.local_name().as_ref(), current.as_mut()) {
                        (b"update", None) => {
                            let mut attrs = self.attributes(e)?;
                            let builder = Builder {
                                type_: attrs.remove(b"type".as_slice()).unwrap_or_default(),
                                ..Builder::default()
                            };
                            if empty {
                                return Err(Error::MissingId {
                                    index: updates_seen,
                                });
                            }
                            current = Some(builder);
                        }
                        (name, Some(b)) => {
                            let f = match name {
                                b"id" => Some(Field::Id),
                                b"title" => Some(Field::Title),
                                b"severity" => Some(Field::Severity),
                                b"description" => Some(Field::Description),
                                _ => None,
                            };
                            if let Some(f) = f {
                                if !empty {
                                    field = Some(f);
                                    text.clear();
                                }
                                continue;
                            }
                            match name {
                                b"issued" => {
                                    b.issued = self.attributes(e)?.remove(b"date".as_slice());
                                }
                                b"reference" => {
                                    let mut a = self.attributes(e)?;
                                    let mut take = |k: &[u8]| a.remove(k).unwrap_or_default();
                                    b.references.push(Reference {
                                        id: take(b"id"),
                                        type_: take(b"type"),
                                        href: take(b"href"),
                                        title: take(b"title"),
                                    });
                                }
                                b"package" => {
                                    let mut a = self.attributes(e)?;
                                    let epoch =
                                        a.get(b"epoch".as_slice()).and_then(|e| normalize_epoch(e));
                                    let mut take = |k: &[u8]| a.remove(k).unwrap_or_default();
                                    b.packages.push(AdvisoryPackage {
                                        name: take(b"name"),
                                        epoch,
                                        version: take(b"version"),
                                        release: take(b"release"),
                                        arch: take(b"arch"),
                                    });
                                }
                                _ => {}
                            }
                        }
                        _ => {}
                    }
                }
                Event::Text(ref t) if field.is_some() => {
                    let s = t.xml_content().map_err(|e| self.xml_error(e.into()))?;
                    text.push_str(&s);
                }
                Event::CData(ref t) if field.is_some() => {
                    let s = t.decode().map_err(|e| self.xml_error(e.into()))?;
                    text.push_str(&s);
                }
                Event::GeneralRef(ref r) if field.is_some() => {
                    if let Some(c) = r.resolve_char_ref().map_err(|e| self.xml_error(e))? {
                        text.push(c);
                    } else {
                        let name = r.decode().map_err(|e| self.xml_error(e.into()))?;
                        match quick_xml::escape::resolve_predefined_entity(&name) {
                            Some(s) => text.push_str(s),
                            None => {
                                text.push('&');
                                text.push_str(&name);
                                text.push(';');
                            }
                        }
                    }
                }
                Event::End(ref e) => {
                    let name = e.local_name();
                    if let (Some(f), Some(b)) = (field, current.as_mut()) {
                        let target = match f {
                            Field::Id => (name.as_ref() == b"id").then_some(&mut b.id),
                            Field::Title => (name.as_ref() == b"title").then_some(&mut b.title),
                            Field::Severity => {
                                (name.as_ref() == b"severity").then_some(&mut b.severity)
                            }
                            Field::Description => {
                                (name.as_ref() == b"description").then_some(&mut b.description)
                            }
                        };
                        if let Some(target) = target {
                            *target = std::mem::take(&mut text);
                            field = None;
                        }
                    }
                    if name.as_ref() == b"update"
                        && let Some(b) = current.take()
                    {
                        field = None;
                        let index = updates_seen;
                        updates_seen += 1;
                        self.finish(b, index, &mut advisories, &mut by_id)?;
                    }
                }
                Event::Eof => {
                    if current.is_some() {
                        return Err(Error::Truncated);
                    }
                    return Ok(advisories);
                }
                _ => {}
            }
        }
    }

    fn finish(
        &self,
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
        // advisory shipping the packages of both.
        if let Some(&i) = by_id.get(&id) {
            let existing = &mut advisories[i];
            for p in b.packages {
                if !existing.packages.contains(&p) {
                    existing.packages.push(p);
                }
            }
            return Ok(());
        }
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
        by_id.insert(id.clone(), advisories.len());
        advisories.push(with_cves_and_bugs(Advisory {
            id,
            type_: b.type_,
            severity: Severity::parse(&b.severity),
            title: b.title.trim().to_owned(),
            issued,
            cves: Vec::new(),
            bugs: Vec::new(),
            references: b.references,
            description: b.description,
            packages: b.packages,
        }));
        Ok(())
    }
}

/// Parses a decompressed `updateinfo.xml` stream (see [`decoder_for`]).
/// Advisories are returned in file order; an id listed twice is merged
/// into one advisory.
pub fn parse(reader: impl BufRead, limits: Limits) -> Result<Vec<Advisory>, Error> {
    let counting = Counting {
        inner: reader,
        read: 0,
        limit: limits.max_bytes,
        exceeded: false,
    };
    let mut reader = quick_xml::Reader::from_reader(counting);
    reader.config_mut().check_end_names = true;
    Parser { reader, limits }.parse()
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

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&bytes[..], Limits::default());
        }

        #[test]
        fn never_panics_on_xml_shaped_input(s in r#"<updates>(<update type="[a-z]{0,3}">(<id>[a-z&;#0-9]{0,4}</id>|<issued date="[0-9a-z -]{0,12}"/>|<package name="a" epoch="[0-9]{0,2}"/>|<reference id="CVE-[0-9-]{0,12}" type="cve"/>|</?[a-z]{1,3}>){0,6}</update>){0,3}(</updates>)?"#) {
            let _ = parse(s.as_bytes(), Limits { max_advisories: 2, max_bytes: 300 });
        }
    }
}
