"""Drives a running ringtrain server through the Python client that openapi-python-client generated from its
/openapi.json (tests/python_client.rs generates it and runs this): submit a job, find it in the history, read
it, tag it; create a study and read its table, and a scale search reusing the job; every answer parsed into the generated models.

    python use_generated_client.py SERVER_URL TOKEN    (with the generated `ringtrain_client` importable)
"""

import sys
import time

from ringtrain_client import AuthenticatedClient
from ringtrain_client.api.jobs import annotate_job, get_job, list_jobs, submit_job
from ringtrain_client.api.studies import create_study, get_study
from ringtrain_client.models import JobAnnotations, JobPage, JobSpec, JobView, StudyRequest, StudyView

SPEC = {
    "name": "from-python",
    "model": {"name": "mlp", "hidden": [16]},
    "dataset": "synthetic:512",
    "workers": 1,
    "per_worker_batch": 32,
    "epochs": 2,
    "lr": {"base": 0.1, "reference_batch": 32, "warmup": {"kind": "none"}},
}


def check(condition, what):
    if not condition:
        sys.exit(f"generated client: {what}")


def main(url, token):
    client = AuthenticatedClient(base_url=url, token=token, raise_on_unexpected_status=True)

    submitted = submit_job.sync_detailed(client=client, body=JobSpec.from_dict(SPEC))
    check(submitted.status_code == 201, f"submit answered {submitted.status_code}: {submitted.content!r}")
    job = submitted.parsed
    check(isinstance(job, JobView), f"submit parsed as {type(job).__name__}")
    check(job.effective is not None, "the job's effective hyperparameters")

    page = list_jobs.sync(client=client, name_prefix="from-python")
    check(isinstance(page, JobPage) and [j.id for j in page.jobs] == [job.id], f"the history: {page}")

    tagged = annotate_job.sync(job.id, client=client, body=JobAnnotations(tags=["python"], note="made by the client"))
    check(isinstance(tagged, JobView) and tagged.tags == ["python"], f"tags: {tagged}")

    deadline = time.time() + 120
    while True:
        read = get_job.sync(job.id, client=client)
        check(isinstance(read, JobView), f"get_job parsed as {type(read).__name__}")
        if str(read.state) in ("succeeded", "failed", "cancelled") or time.time() > deadline:
            break
        time.sleep(0.5)
    check(str(read.state) == "succeeded", f"the job ended {read.state}: {read.error}")

    request = StudyRequest.from_dict({"name": "python-study", "base": SPEC, "axes": {"workers": [1, 2]}})
    created = create_study.sync_detailed(client=client, body=request)
    check(created.status_code == 201, f"create_study answered {created.status_code}: {created.content!r}")
    study = created.parsed
    check(isinstance(study, StudyView) and len(study.points) == 2, f"the study: {study}")
    again = get_study.sync(study.id, client=client)
    check(isinstance(again, StudyView) and again.name == "python-study", f"get_study: {again}")

    # a scale search that reuses the finished job as its reference: candidates only, under halving
    search_request = StudyRequest.from_dict(
        {"name": "python-search", "template": "scale_search", "reference_job": str(job.id),
         "target_workers": 2, "candidates": 2})
    searched = create_study.sync_detailed(client=client, body=search_request)
    check(searched.status_code == 201, f"the scale search answered {searched.status_code}: {searched.content!r}")
    search = searched.parsed
    check(isinstance(search, StudyView) and len(search.points) == 3, f"the scale search: {search}")
    reference = search.points[0]
    check(reference.reused and reference.job_id == job.id, f"the reused reference: {reference}")
    check(search.search is not None and search.search.spec["rungs"] == [1], f"the search: {search.search}")
    print(f"generated client: job {job.id} succeeded, study {study.id} has {len(again.points)} points, "
          f"scale search {search.id} reuses the job")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
