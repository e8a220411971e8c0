"""Planted models where the study's claims are true or false by construction, and the validation
table (claim x planted truth -> the pipeline's verdict) that shows the verdicts can fail for the
right reason."""
