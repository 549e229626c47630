"""A cluster's calibration over REST: see it (webapp.selectors.calibration), and ask a worker to refit it
(webapp.services.calibration)."""
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from ..selectors.calibration import calibration_report
from ..services.calibration import cluster_calibration_request

_NUMBERS = serializers.DictField(child=serializers.FloatField(), read_only=True)


class ClusterCalibrationSerializer(serializers.Serializer):
    cluster = serializers.IntegerField(read_only=True)
    records = serializers.IntegerField(read_only=True, help_text="Completed runs measured on the cluster")
    runs = serializers.IntegerField(read_only=True, help_text="Records the stored fit is made of")
    min_runs = serializers.IntegerField(read_only=True, help_text="Records a fit needs before estimates use it")
    usable = serializers.BooleanField(read_only=True, help_text="Whether estimates on the cluster use the fit")
    note = serializers.CharField(read_only=True)
    options = serializers.DictField(read_only=True, help_text="The fitted EstimateOptions fields")
    time_coefficients = _NUMBERS
    time_error = serializers.DictField(read_only=True,
                                       help_text="Leave-one-out relative step-time error: median, mean, max, runs")
    error = serializers.CharField(read_only=True, help_text="Why the latest refit made no fit")
    fitted_at = serializers.DateTimeField(read_only=True, allow_null=True)


class ClusterCalibrationActions:
    """``GET clusters/<id>/calibration/`` and, for staff, ``POST clusters/<id>/calibrate/`` (a refit, queued)."""

    @extend_schema(responses=ClusterCalibrationSerializer)
    @action(detail=True, methods=["get"])
    def calibration(self, request, pk=None):
        """The cluster's fitted step-time terms, the runs they come from and their held-out error."""
        return Response(ClusterCalibrationSerializer(calibration_report(self.get_object())).data)

    @extend_schema(request=None, responses={202: ClusterCalibrationSerializer})
    @action(detail=True, methods=["post"])
    def calibrate(self, request, pk=None):
        """Refit the cluster's terms to its measured runs, on a worker; the answer is the calibration as it stands
        (GET calibration/ shows the new fit once the worker has made it)."""
        cluster = self.get_object()
        cluster_calibration_request(cluster.pk)
        return Response(ClusterCalibrationSerializer(calibration_report(cluster)).data,
                        status=status.HTTP_202_ACCEPTED)
