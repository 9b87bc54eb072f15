//! One conformance suite, run against every backend: in memory, a local directory,
//! `object_store`'s in-memory store, and S3 on a real S3-compatible server (moto, started by
//! `.ci/run` on 127.0.0.1; `S3_ENDPOINT` names it).

// The suite is a helper shared by the tests; a failed step is a failed test.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use futures_util::StreamExt;
#[cfg(feature = "fs")]
use tower_agent_storage::LocalFs;
use tower_agent_storage::{ByteStream, InMemory, Storage, StorageError, StoragePath};

fn path(p: &str) -> StoragePath {
    StoragePath::parse(p).expect("a valid path")
}

fn chunks(total: usize, chunk: usize) -> (Vec<u8>, ByteStream) {
    let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
    let parts: Vec<Result<Bytes, StorageError>> = data
        .chunks(chunk)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    (data, Box::pin(futures_util::stream::iter(parts)))
}

/// Every behaviour of the trait, on `storage`.
async fn conformance(storage: &dyn Storage) {
    // Put, get, overwrite.
    let a = path("/results/search_c1");
    storage.put(&a, Bytes::from("first")).await.unwrap();
    assert_eq!(storage.get(&a).await.unwrap(), "first");
    storage
        .put(&a, Bytes::from("line 1\nline 2\n"))
        .await
        .unwrap();
    assert_eq!(storage.get(&a).await.unwrap(), "line 1\nline 2\n");

    // Missing values.
    let missing = path("results/none");
    assert!(storage.get(&missing).await.unwrap_err().is_not_found());
    assert!(
        storage
            .get_range(&missing, 0..1)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(
        storage
            .get_stream(&missing)
            .await
            .err()
            .unwrap()
            .is_not_found()
    );
    storage.delete(&missing).await.unwrap();

    // Ranges, clipped to the end.
    assert_eq!(storage.get_range(&a, 7..13).await.unwrap(), "line 2");
    assert_eq!(storage.get_range(&a, 7..1_000).await.unwrap(), "line 2\n");
    assert_eq!(storage.get_range(&a, 100..200).await.unwrap(), "");

    // Listing by string prefix, ordered, with sizes.
    storage
        .put(&path("results/search_c2"), Bytes::from("xy"))
        .await
        .unwrap();
    storage
        .put(&path("results/sub/deep"), Bytes::from("z"))
        .await
        .unwrap();
    storage
        .put(&path("other/x"), Bytes::from("o"))
        .await
        .unwrap();
    let listed: Vec<(String, u64)> = storage
        .list("results/")
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.path.as_str().to_owned(), e.size))
        .collect();
    assert_eq!(
        listed,
        [
            ("results/search_c1".to_owned(), 14),
            ("results/search_c2".to_owned(), 2),
            ("results/sub/deep".to_owned(), 1)
        ]
    );
    let narrow: Vec<String> = storage
        .list("/results/search_")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.path.as_str().to_owned())
        .collect();
    assert_eq!(narrow, ["results/search_c1", "results/search_c2"]);
    assert!(storage.list("nothing/").await.unwrap().is_empty());

    // Streaming both ways, 3 MB in 64 KB chunks.
    let big = path("big/value");
    let (data, stream) = chunks(3 * 1024 * 1024 + 17, 64 * 1024);
    assert_eq!(
        storage.put_stream(&big, stream).await.unwrap(),
        data.len() as u64
    );
    let mut read = Vec::new();
    let mut stream = storage.get_stream(&big).await.unwrap();
    while let Some(chunk) = stream.next().await {
        read.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(read.len(), data.len());
    assert!(read == data, "the streamed value round-trips");
    let middle = storage.get_range(&big, 1_000_000..1_000_010).await.unwrap();
    assert_eq!(&middle[..], &data[1_000_000..1_000_010]);

    // A failing stream stores nothing and keeps the old value.
    let failing: ByteStream = Box::pin(futures_util::stream::iter(vec![
        Ok(Bytes::from("partial")),
        Err(StorageError::backend(
            "the source broke",
            std::io::Error::other("eof"),
        )),
    ]));
    assert!(storage.put_stream(&a, failing).await.is_err());
    assert_eq!(storage.get(&a).await.unwrap(), "line 1\nline 2\n");

    // Append creates, then appends.
    let log = path("conversation_history/s1.md");
    storage.append(&log, Bytes::from("# one\n")).await.unwrap();
    storage.append(&log, Bytes::from("# two\n")).await.unwrap();
    assert_eq!(storage.get(&log).await.unwrap(), "# one\n# two\n");

    // Delete.
    storage.delete(&a).await.unwrap();
    assert!(storage.get(&a).await.unwrap_err().is_not_found());
    assert_eq!(storage.list("results/search_").await.unwrap().len(), 1);
}

#[tokio::test]
async fn in_memory() {
    conformance(&InMemory::new()).await;
}

#[cfg(feature = "fs")]
#[tokio::test]
async fn local_fs() {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalFs::new(dir.path().join("root"));
    conformance(&storage).await;
    // No temporary file is left behind, even after the failed stream.
    let mut leftovers = Vec::new();
    let mut pending = vec![dir.path().to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(d).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                pending.push(entry.path());
            } else if entry.file_name().to_string_lossy().contains(".partial-") {
                leftovers.push(entry.path());
            }
        }
    }
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[cfg(all(unix, feature = "fs"))]
#[tokio::test]
async fn local_fs_refuses_a_symbolic_link_out_of_its_root() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "s3cr3t").unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), root.join("file")).unwrap();
    let storage = LocalFs::new(&root);
    for p in ["link/secret", "file"] {
        let err = storage.get(&path(p)).await.unwrap_err();
        assert!(
            matches!(err, StorageError::InvalidPath { .. }),
            "{p}: {err}"
        );
        let err = storage.put(&path(p), Bytes::from("x")).await.unwrap_err();
        assert!(
            matches!(err, StorageError::InvalidPath { .. }),
            "{p}: {err}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(outside.join("secret")).unwrap(),
        "s3cr3t"
    );
}

#[tokio::test]
async fn errors_become_backend_errors_of_the_core() {
    let err: tower_agent_core::Error = StorageError::NotFound("/x".into()).into();
    assert_eq!(err.kind(), tower_agent_core::ErrorKind::Backend);
    let err: tower_agent_core::Error = StoragePath::parse("../x").unwrap_err().into();
    assert_eq!(err.kind(), tower_agent_core::ErrorKind::BadRequest);
}

#[cfg(feature = "object-store")]
#[tokio::test]
async fn object_store_in_memory() {
    let store = std::sync::Arc::new(object_store::memory::InMemory::new());
    conformance(&tower_agent_storage::ObjectStoreStorage::new(store)).await;
}

/// S3 on the S3-compatible server `.ci/run` starts (moto). Without `S3_ENDPOINT` the test
/// says why it skips, and fails in CI.
#[cfg(feature = "aws")]
#[tokio::test]
async fn s3_on_a_real_server() {
    use object_store::aws::AmazonS3Builder;

    let Ok(endpoint) = std::env::var("S3_ENDPOINT") else {
        assert!(
            std::env::var("CI").is_err(),
            "S3_ENDPOINT is not set: .ci/run starts moto_server on 127.0.0.1 and exports it"
        );
        eprintln!("skipped: S3_ENDPOINT is not set (run `bash .ci/run`, or start moto_server)");
        return;
    };
    assert!(
        endpoint.starts_with("http://127.0.0.1"),
        "tests talk to 127.0.0.1 only: {endpoint}"
    );
    // A bucket of its own (moto accepts unsigned bucket creation).
    let bucket = format!("tower-agent-{}", std::process::id());
    let created = reqwest::Client::new()
        .put(format!("{endpoint}/{bucket}"))
        .send()
        .await
        .expect("the S3 server answers");
    assert!(created.status().is_success(), "{}", created.status());
    let s3 = AmazonS3Builder::new()
        .with_endpoint(&endpoint)
        .with_allow_http(true)
        .with_bucket_name(&bucket)
        .with_region("us-east-1")
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .with_virtual_hosted_style_request(false)
        .build()
        .expect("an S3 client");
    let storage = tower_agent_storage::ObjectStoreStorage::new(std::sync::Arc::new(s3));
    let shown = format!("{storage:?}");
    assert!(
        !shown.contains("testing"),
        "no credentials in Debug: {shown}"
    );
    conformance(&storage).await;
}
