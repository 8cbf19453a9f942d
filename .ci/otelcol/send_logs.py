"""Sends one log record over OTLP/gRPC to the test collector (.ci/services otel) with the Python SDK."""
import sys, time
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.resources import Resource

provider = LoggerProvider(resource=Resource.create({"service.name": "logbus-python"}))
provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter(endpoint="127.0.0.1:4327", insecure=True)))
provider.get_logger("send_logs").emit(timestamp=time.time_ns(), severity_number=SeverityNumber.INFO, severity_text="INFO",
                                      body=sys.argv[1] if len(sys.argv) > 1 else "hello from python", attributes={"k": "v"})
provider.shutdown()  # flushes the batch
